"""The SPS(B) profiler (needs torch): time verification and drafting steps on a CPU or a GPU.

`model` and `draft_model` build the target and a DSpark-shaped drafter with random weights,
`timing` is the replay harness, `graphs` the CUDA-graph capture, `sweep` walks the
(tokens × context) grid, `card` writes the profile folder, `peaks` and `accuracy` measure
the device's ceilings and the analytic roofline's error against the measurement.
"""
