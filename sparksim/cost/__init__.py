"""The cost model: what a step costs on a machine.

`profile` (a profile on disk: its SPS(B) table, KV and draft terms, card), `pricing` (the
one step-pricing rule the engine charges and the policies optimise), `roofline` and
`analytic` (profiles built from a model's shape and a GPU's specs), `models` (model
shapes), `fitted` (published fitted cost models), `engine_tables` (the engines' own
profiler tables, exported and imported). Imports nothing above `sparksim.config`.
"""
