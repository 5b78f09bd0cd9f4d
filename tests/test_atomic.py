"""Atomic writes give what an ordinary write gives: the umask decides who may read the results.

tempfile makes private files (0600) and folders (0700); left as they are, a run folder was
0700 and sweep.csv 0600 beside parquet files at 0644, so a colleague could read one file
of a results folder and not the next.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from sparksim.atomic import atomic_dir, atomic_file, current_umask, write_text
from sparksim.studies.sweep import write_sweep


@pytest.fixture(params=[0o022, 0o077, 0o002])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_current_umask_reads_the_umask_and_leaves_it_as_it_was(umask: int) -> None:
    assert current_umask() == umask
    assert current_umask() == umask


def test_atomic_files_and_folders_get_the_umask_permissions_of_a_plain_write(umask: int, tmp_path: Path) -> None:
    write_text(tmp_path / "a.txt", "x")
    with atomic_file(tmp_path / "b.bin") as tmp:
        tmp.write_bytes(b"x")
    with atomic_dir(tmp_path / "run") as tmp:
        (tmp / "inside.txt").write_text("x")
    (tmp_path / "plain.txt").write_text("x")  # what open() gives, for comparison
    assert mode(tmp_path / "a.txt") == mode(tmp_path / "b.bin") == 0o666 & ~umask == mode(tmp_path / "plain.txt")
    assert mode(tmp_path / "run") == 0o777 & ~umask
    assert mode(tmp_path / "run" / "inside.txt") == 0o666 & ~umask


def test_a_sweep_folder_has_one_permission_for_every_file(umask: int, tmp_path: Path) -> None:
    table = pd.DataFrame({"policy": ["a", "a"], "workload.concurrency": [1, 2], "lossless": [True, True],
                          "interactivity": [10.0, 9.0], "tput_per_gpu": [100.0, 180.0],
                          "verify_budget_per_request": [1.0, 1.0]})
    out = write_sweep(tmp_path / "sw", table, {"title": "t"})
    files = [p for p in out.iterdir() if p.is_file()]
    assert {"sweep.parquet", "sweep.csv", "sweep.yaml"} <= {p.name for p in files}
    assert {p.name: mode(p) for p in files} == {p.name: 0o666 & ~umask for p in files}


def _dead_pid() -> int:
    """A process id that ran and has exited (reaped), so no process holds it now."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(proc.stdout)


def test_what_a_killed_process_left_is_removed_by_the_next_write_beside_it(tmp_path: Path) -> None:
    # Why: a run killed outright (SIGKILL, a lost node) cannot remove its temporary folder;
    # a million-request run's streamed records are gigabytes, and they would pile up beside
    # the results. Only a gone process's, only this host's: another run may be writing now.
    import socket

    from sparksim.atomic import owned_prefix, remove_orphans
    from sparksim.sim.runner import records_folder

    host, dead = socket.gethostname(), _dead_pid()
    killed = tmp_path / f".out.records-{host}-{dead}-abc"
    running = tmp_path / f".out.records-{host}-{os.getppid()}-abc"  # a live process: our parent
    elsewhere = tmp_path / f".out.records-some-other-host-{dead}-abc"
    old_style = tmp_path / ".out.records-xyz"  # no owner in its name: left alone
    for folder in (killed, running, elsewhere, old_style):
        (folder / "steps.parquet").parent.mkdir()
        (folder / "steps.parquet").write_bytes(b"x")
    with records_folder(tmp_path / "out") as mine:
        assert mine.name.startswith(owned_prefix(".out.records-"))
        assert not killed.exists()
        assert running.exists() and elsewhere.exists() and old_style.exists()
    assert not mine.exists()
    # atomic writes clean their own stem the same way, and not the records'
    left = tmp_path / f".out.{host}-{dead}-q.tmp"
    left.mkdir()
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "summary.json").write_text("{}")
    assert not left.exists() and running.exists()
    assert remove_orphans(tmp_path, ".out.records-") == []
