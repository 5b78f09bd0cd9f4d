"""A real continuous-batching speculative-decoding engine on the built-in target and drafter.

It schedules with the simulator's own `Policy` objects and writes the simulator's result
format, so a live run and a simulated run of the same scenario can be compared
(`sparksim live`, analyses/fidelity.py). Needs the torch extra.
"""
