"""What one engine step is, shared by the policies, the simulator and the live engine.

`batch_layout` (the running batch's state rows), `acceptance` (the replay rule),
`kernels` (the compiled loops: the policies' Θ walk and fill counts, the engine's
advance), `records` (the request and step records and the window's streaming statistics).
"""
