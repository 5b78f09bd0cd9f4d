"""The SPS(B) profiler (needs torch): time verification and drafting steps on a CPU or a GPU.

`model` and `draft_model` build the target and a DSpark-shaped drafter with random weights,
`timing` is the replay harness, `graphs` the CUDA-graph capture, `sweep` walks the
(tokens × context) grid, the drafter's (requests × positions) and a few prompt-only steps,
`fit` splits the grid into dense and KV cost and fits prefill attention, `memory` reads
the device's memory figures, `card` writes the profile folder, `peaks` and `accuracy`
measure the device's ceilings and the analytic roofline's error against the measurement.
"""
