"""NumPy arrays to and from arrow arrays through their buffers, and parquet columns read as NumPy.

pyarrow's own conversions (`pa.array(ndarray)`, `Array.to_numpy`, `pq.read_table`) import
pandas on first use, about 0.25 s of a `sparksim run` that needs no pandas to read a trace
set, write its tables and summarise them. These functions give the same arrays (and so the
same files) for the numeric and string columns sparksim's files hold; any other type goes
through pyarrow's own conversion, pandas and all.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    import pyarrow as pa


def to_numpy(values: pa.Array | pa.ChunkedArray) -> NDArray[Any]:
    """Return what `values.to_numpy(zero_copy_only=False)` returns.

    A numeric column without nulls is a read-only view of its buffer; one with nulls is a
    copy with NaN at the nulls (integers become float64, as pyarrow makes them); strings
    are an object array (None at the nulls).
    """
    import pyarrow as pa

    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    kind = arr.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return np.array(arr.to_pylist(), dtype=object)
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        return values.to_numpy(zero_copy_only=False)
    dtype = np.dtype(kind.to_pandas_dtype())
    validity, data = arr.buffers()
    out = np.frombuffer(data, dtype, count=len(arr), offset=arr.offset * dtype.itemsize)
    if arr.null_count:
        bits = np.unpackbits(np.frombuffer(validity, np.uint8), count=arr.offset + len(arr), bitorder="little")
        out = out.astype(np.float64 if dtype.kind in "iu" else dtype)
        out[bits[arr.offset:] == 0] = np.nan
    return out


def from_numpy(values: NDArray[Any]) -> pa.Array:
    """Return `pa.array(values, from_pandas=True)` for a numeric array: NaN becomes null."""
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    nulls = np.isnan(values) if values.dtype.kind == "f" else None
    buffers = [None, pa.py_buffer(values)]
    count = 0
    if nulls is not None and nulls.any():
        buffers[0] = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
        count = int(nulls.sum())
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), buffers, null_count=count)


def read_parquet_columns(path: Path, columns: list[str] | None = None) -> dict[str, NDArray[Any]]:
    """Return a parquet file's columns (all, or those named) as `to_numpy` arrays, in file order."""
    import pyarrow.parquet as pq

    table = pq.ParquetFile(path).read(columns=columns)
    return {name: to_numpy(table.column(name)) for name in table.column_names}
