"""Studies built on many runs: sweeps, capacity, frontiers, calibration, cross-checks.

`sweep` (grids of scenarios, resumable: `sweep_store`; in processes: `sweep_pool`; on a
Ray cluster: `sweep_ray`), `capacity` (the highest load meeting an SLO), `frontier`
(Pareto frontiers), `calibration` (fitting a profile to measured runs, which
`measured_runs` reads and `run_replay` replays), `crosscheck` (DistServe's benchmark
scenario).
"""
