"""The cost model: what a step costs on a machine.

`profile` (a profile: its SPS(B) table, KV and draft terms, and their lookups), `card` (the
profile card's keys, typed and range-checked), `profile_files` (a profile folder read and
written), `legacy_grid` (old context grids converted to the current tables), `pricing` (the
one step-pricing rule the engine charges and the policies optimise), `roofline` and
`analytic` (profiles built from a model's shape and a GPU's specs) over the roofline's
terms: `target_step`, `draft_step`, `parallelism` and `cuda_graphs`; `models` (model
shapes), `fitted` (published fitted cost models), `engine_tables` (the engines' own
profiler tables; their files in `engine_table_files`, export and import in
`engine_table_convert`). Imports nothing above `sparksim.config`.
"""
