"""Non-anticipation bias: whether a policy's verification lengths peek at the outcome.

`biaslab` (the Monte Carlo lab on recorded traces), `bias_exact` (exact output
distributions on real models, path by path).
"""
