"""Sweeps on a Ray cluster: the inputs travel with the tasks, so a node without this disk runs
points, and the rows are those a local sweep makes (issue 23, item 5).

Needs the `ray` extra (`pip install -e ".[ray]"`); without it the cluster tests skip. The
packing and unpacking (`sparksim.studies.sweep_ray`) are tested without Ray.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

import sparksim.studies.sweep_ray
from sparksim.errors import ConfigError
from sparksim.studies.sweep import SweepPoint, grid, parse_vary, run_point, run_sweep
from sparksim.studies.sweep_ray import Bundle, materialise, run_shipped, ship
from sparksim.studies.sweep_store import PointStore

ROOT = Path(__file__).resolve().parents[1]


def copied_inputs(sloped_profile: Path, varied_traces: Path, where: Path) -> tuple[Path, Path]:
    where.mkdir(parents=True)
    return (Path(shutil.copytree(sloped_profile, where / sloped_profile.name)),
            Path(shutil.copytree(varied_traces, where / varied_traces.name)))


def base(profile: Path, traces: Path) -> list[str]:
    return [f"profile={profile}", f"traces={traces}", "run.duration_s=3"]


def test_a_shipped_point_runs_without_the_drivers_files(sloped_profile: Path, varied_traces: Path,
                                                        tmp_path: Path) -> None:
    # Pack, delete the originals, unpack elsewhere: the row is the one the originals gave,
    # a plug-in policy file included, and no path of the worker's cache leaks into it.
    profile, traces = copied_inputs(sloped_profile, varied_traces, tmp_path / "driver")
    policy_file = tmp_path / "driver" / "mine.py"
    shutil.copy(ROOT / "examples" / "fixed_budget.py", policy_file)
    points = [SweepPoint("two-step", ("workload.concurrency=4",)),
              SweepPoint(f"{policy_file}:FixedBudget:per_request=2", ("workload.concurrency=2",))]
    expected = [run_point(None, base(profile, traces), p) for p in points]
    bundle, how = ship(None, base(profile, traces), points)
    assert len(bundle.blobs) == 3  # profile, traces, the policy file: each once
    shutil.rmtree(tmp_path / "driver")
    cache = tmp_path / "worker-cache"
    got = [run_shipped(run_point, bundle.blobs, None, base(profile, traces), p, h, root=cache)
           for p, h in zip(points, how, strict=True)]
    assert got == expected
    assert (cache / how[0].paths[0][1] / profile.name / "card.yaml").is_file()


def test_unpacking_is_once_per_content(sloped_profile: Path, tmp_path: Path) -> None:
    bundle = Bundle()
    digest = bundle.add(sloped_profile)
    assert bundle.add(sloped_profile) == digest and len(bundle.blobs) == 1
    first = materialise(digest, bundle.blobs[digest], tmp_path)
    (first / "card.yaml").write_text("changed on the worker")  # a second call must not unpack again
    assert materialise(digest, bundle.blobs[digest], tmp_path) == first
    assert (first / "card.yaml").read_text() == "changed on the worker"
    with pytest.raises(ConfigError, match="does not exist"):
        bundle.add(tmp_path / "missing")


@pytest.fixture(scope="module")
def two_node_cluster() -> Iterator[object]:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_a_two_node_ray_sweep_makes_the_local_table_from_shipped_inputs(
    two_node_cluster: object, sloped_profile: Path, varied_traces: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    profile, traces = copied_inputs(sloped_profile, varied_traces, tmp_path / "driver")
    points = grid(parse_vary(["workload.concurrency=1,4"]), ["static:gamma=0", "two-step"])
    local = run_sweep(None, base(profile, traces), points, workers=1)

    real_ship = sparksim.studies.sweep_ray.ship

    def ship_then_delete(*args: object, **kwargs: object) -> object:
        out = real_ship(*args, **kwargs)  # type: ignore[arg-type]
        shutil.rmtree(tmp_path / "driver")  # the tasks must run from what was shipped
        return out

    monkeypatch.setattr(sparksim.studies.sweep_ray, "ship", ship_then_delete)
    store = PointStore(tmp_path / "points")
    remote = run_sweep(None, base(profile, traces), points, backend="ray", store=store)
    pd.testing.assert_frame_equal(remote, local)
    assert len(list((tmp_path / "points").glob("*.json"))) == len(points)  # saved on the driver
