"""The simulator core: a serving cluster in SimPy, from a scenario to its results.

`engine` (one replica's step loop: plan, price, decide, apply, record), `cluster`
(replicas, routing, arrivals, prefill/decode hand-off), `workload` (who sends what when),
`prefix_cache`, `invariants` (the `--check` rules), `metrics` (the summary), `runner`
(load inputs, simulate, write results), `validation` (`sparksim validate`).
"""
