"""Plain CSV files read without pandas: the columns `pandas.read_csv` reads, or None.

Why: profiles and arrival logs are read on every run's start-up, where pandas would cost a
third of a short run; a file read here must give the numbers (and dtypes) pandas gives, to
the last bit, and any file pandas might read otherwise must be left to pandas.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sparksim.plain_csv import read_csv_columns, read_plain_csv, to_numeric


def _same_as_pandas(path: Path, text: tuple[str, ...] = ()) -> None:
    got = read_plain_csv(path, 100_000, text)
    assert got is not None, path.read_text()[:200]
    want = pd.read_csv(path)
    assert list(got) == list(want.columns)
    for name, values in got.items():
        expected = want[name].to_numpy()
        assert values.dtype == expected.dtype, name
        assert values.tobytes() == expected.tobytes() if values.dtype != object else values.tolist() == expected.tolist()


def test_numbers_read_bit_for_bit_as_pandas_reads_them(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    floats = np.concatenate([np.cumsum(rng.exponential(0.25, 3000)), rng.lognormal(0, 6, 3000),
                             -rng.random(3000) * 1e-7])
    path = tmp_path / "a.csv"
    pd.DataFrame({"arrival_s": floats, "prompt_tokens": rng.integers(1, 10**6, floats.size),
                  "output_tokens": rng.integers(-5, 5, floats.size)}).to_csv(path, index=False)
    _same_as_pandas(path)
    written = [f"{v:.17g}" for v in floats[:500]] + [f"{v:.3e}" for v in floats[:500]] + ["1.", ".5", "007", "-0"]
    path.write_text("x,y\n" + "".join(f"{v},{k}\n" for k, v in enumerate(written)))
    _same_as_pandas(path)
    path.write_text("tokens,step_ms\n1,21.9731096\n2,22\n1000000,1e5")  # no final newline
    _same_as_pandas(path)


def test_a_text_column_of_words_reads_as_pandas_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("arrival_s,domain,prompt_tokens\n0.5,code,10\n1.5,math-2,20\n")
    _same_as_pandas(path, ("domain",))


@pytest.mark.parametrize("body", [
    "a,b\n1,2\n\n3,4\n",  # a blank line
    "a,b\n1,\n",  # a missing cell
    "a,b\n1,2,3\n",  # a row too long
    "a,a\n1,2\n",  # a repeated name
    "a, b\n1,2\n",  # a space
    'a,b\n"1",2\n',  # quotes
    "a,b\r\n1,2\r\n",  # CRLF
    "\ufeffa,b\n1,2\n",  # a byte-order mark
    "a,b\n1,nan\n",  # a missing value
    "a,b\n1,inf\n",
    "a,b\n1,1e999\n",  # overflows to infinity
    "a,b\n1,+2\n",
    "a,b\n1,x\n",  # text where numbers are expected
    "a,b\n12345678901234567890,2\n",  # too long for int64
    "a,b\n",  # no rows
    "",
])
def test_anything_else_is_left_to_pandas(body: str, tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(body.encode())
    assert read_plain_csv(path, 100) is None


@pytest.mark.parametrize("cell", ["NA", "nan", "True", "false", "None", "null", "inf", "Infinity", "1x", "x y"])
def test_a_word_pandas_reads_otherwise_is_left_to_pandas(cell: str, tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(f"a,domain\n1,code\n2,{cell}\n")
    assert read_plain_csv(path, 100, ("domain",)) is None


def test_more_rows_than_asked_for_are_left_to_pandas(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("a\n1\n2\n3\n")
    assert read_plain_csv(path, 2) is None and len(read_csv_columns(path, 2)["a"]) == 3  # pandas reads max + 1
    assert read_plain_csv(path, 3) is not None


def test_a_file_that_is_not_plain_reads_through_pandas(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text('a,b\n1,"x"\n,2.5\n')
    got = read_csv_columns(path, 10)
    want = pd.read_csv(io.StringIO(path.read_text()))
    assert got["a"].tolist()[:1] == [1.0] and np.isnan(got["a"][1]) and got["b"].tolist() == want["b"].tolist()
    assert to_numeric(got["b"]).tolist()[1] == 2.5 and np.isnan(to_numeric(got["b"])[0])
