"""A run reads a trace set's positions only when it replays them (`load_traceset(positions=False)`).

Plain decoding replays no confidence and no acceptance, so its start skips positions.parquet
(the default set's largest file); a policy that drafts reads and checks it before simulating,
and a broken file is refused there, as before.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from sparksim.errors import FormatError
from sparksim.sim.runner import load_inputs, load_scenario, simulate
from sparksim.traces.format import load_traceset

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = REPO / "traces" / "synth-dspark-qwen3-8b"


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    """The default trace set with its positions file cut short (unreadable as parquet)."""
    path = tmp_path / "broken"
    shutil.copytree(DEFAULT_TRACES, path)
    data = (path / "positions.parquet").read_bytes()
    (path / "positions.parquet").write_bytes(data[: len(data) // 2])
    return path


def test_a_deferred_set_reads_the_same_positions_at_first_use() -> None:
    whole = load_traceset(DEFAULT_TRACES, extras=False)
    lazy = load_traceset(DEFAULT_TRACES, extras=False, positions=False)
    assert lazy.deferred and "conf" not in vars(lazy) and "accepted" not in vars(lazy)
    assert lazy.gamma == whole.gamma and lazy.num_requests == whole.num_requests
    np.testing.assert_array_equal(lazy.offsets, whole.offsets)
    np.testing.assert_array_equal(lazy.accepted64, whole.accepted64)  # the first read loads both
    assert not lazy.deferred
    np.testing.assert_array_equal(lazy.conf, whole.conf)


def test_a_deferred_set_is_pickled_whole() -> None:
    lazy = load_traceset(DEFAULT_TRACES, extras=False, positions=False)
    copy = pickle.loads(pickle.dumps(lazy))  # a sweep worker may not see the files
    assert not copy.deferred
    np.testing.assert_array_equal(copy.conf, load_traceset(DEFAULT_TRACES, extras=False).conf)


def test_a_broken_positions_file_fails_at_the_first_read(broken: Path) -> None:
    with pytest.raises(FormatError, match=r"positions\.parquet"):
        load_traceset(broken, extras=False)
    lazy = load_traceset(broken, extras=False, positions=False)  # nothing read yet
    with pytest.raises(FormatError, match=r"positions\.parquet"):
        _ = lazy.conf


def test_a_card_without_a_usable_gamma_is_refused_without_the_positions(tmp_path: Path) -> None:
    path = tmp_path / "card"
    shutil.copytree(DEFAULT_TRACES, path)
    card = (path / "card.yaml").read_text()
    (path / "card.yaml").write_text(card.replace("gamma: ", "gamma: 0 #", 1))
    with pytest.raises(FormatError, match="gamma"):
        load_traceset(path, extras=False, positions=False)


def test_plain_decoding_never_reads_the_positions_and_a_drafting_run_is_refused_first(broken: Path) -> None:
    sets = [f"traces={broken}", "run.duration_s=2", "workload.concurrency=4"]
    plain, base = load_scenario(None, [*sets, "policy.gamma=0"], "static")
    assert simulate(plain, base).num_steps > 0
    drafting, base = load_scenario(None, sets, "static:gamma=3")
    with pytest.raises(FormatError, match=r"positions\.parquet"):
        load_inputs(drafting, base)
