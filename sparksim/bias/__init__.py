"""Non-anticipation bias: whether a policy's verification lengths peek at the outcome.

`biaslab` (the Monte Carlo lab on recorded traces), `bias_exact` (exact output
distributions on real models, path by path: the lab over many contexts and policies), with
its parts `first_token` (one step's exact law), `path_decider` (a policy's decision on every
path), `first_token_mc` (the step sampled, to check) and `model_cases` (real-model states).
"""
