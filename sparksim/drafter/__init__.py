"""The drafter side (torch): target LM adapters, the DSpark drafter, training, STS and the recorder.

Import the submodules directly; this package imports nothing at load time, so
`sparksim.drafter.calibrate` (NumPy only) works without torch. See docs/drafter.md.
"""
