"""NumPy to and from arrow by buffers: the arrays pyarrow's own conversions give, without pandas.

Why: pyarrow's `to_numpy` and `pa.array` import pandas; trace sets, streamed tables and the
summary's columns go through these instead, and must not change a value, a NaN or a null.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from sparksim.arrow_numpy import from_numpy, to_numpy

ARRAYS: dict[str, Any] = {
    "int64": pa.array([3, -1, 7, 9], type=pa.int64()),
    "int32 with a null": pa.array([3, None, 7], type=pa.int32()),
    "int8": pa.array([1, 2, 3], type=pa.int8()),
    "uint16": pa.array([1, 2, 65535], type=pa.uint16()),
    "float32 with a null": pa.array([0.5, None, 0.25], type=pa.float32()),
    "float64 with NaN and a null": pa.array([0.5, float("nan"), None, 2.0], type=pa.float64()),
    "a slice with a null": pa.array([1.0, None, 3.0, 4.0, None, 6.0, 7.0, 8.0, 9.0, None], type=pa.float64()).slice(3, 6),
    "an int slice": pa.array(list(range(20)), type=pa.int64()).slice(5, 7),
    "chunks": pa.chunked_array([[1, 2], [3, None, 5]], type=pa.int64()),
    "no chunks": pa.chunked_array([], type=pa.float64()),
    "empty": pa.array([], type=pa.float64()),
    "strings with a null": pa.array(["a", None, "bc"], type=pa.large_string()),
    "strings": pa.array(["x", "y"], type=pa.string()),
}


@pytest.mark.parametrize("name", sorted(ARRAYS))
def test_to_numpy_gives_what_pyarrow_gives(name: str) -> None:
    got, want = to_numpy(ARRAYS[name]), ARRAYS[name].to_numpy(zero_copy_only=False)
    assert got.dtype == want.dtype
    if got.dtype == object:
        assert got.tolist() == want.tolist()
    else:
        np.testing.assert_array_equal(got, want)  # NaN where NaN


@pytest.mark.parametrize("values", [
    np.array([0.5, np.nan, 2.0, np.nan]), np.arange(10, dtype=np.int64), np.zeros(0), np.full(9, np.nan),
    np.arange(20, dtype=np.float64)[::2],
])
def test_from_numpy_gives_what_pa_array_from_pandas_gives(values: np.ndarray) -> None:
    got, want = from_numpy(values), pa.array(values, from_pandas=True)
    assert got.type == want.type and got.null_count == want.null_count and got.equals(want)
