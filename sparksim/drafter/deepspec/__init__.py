"""DeepSpec drafter checkpoints (DSpark, DFlash, Eagle3) run by sparksim's own modules, and their recorder.

DeepSpec (github.com/deepseek-ai/DeepSpec) saves a drafter with HF `save_pretrained`: `config.json`
is the target's Qwen3 config with the drafter's fields added (`architectures`, `target_layer_ids`,
`num_target_layers`, `block_size` or `ttt_length`, …) and `model.safetensors` (or shards with
`model.safetensors.index.json`) holds every tensor, the drafter's own copies of the target's
embedding and LM head included. This package reads that layout into sparksim's modules (nothing of
DeepSpec's code is used) and exposes one call the recorder needs, `propose`: given the target's
hidden states and the anchors, the γ draft logits, the sampled tokens and the confidence logits.

- **DSpark** (`Qwen3DSparkModel` with `markov_rank > 0`): the parallel block backbone of
  `sparksim/drafter/model.py` built from `sparksim.decoder` blocks with Qwen3's grouped-query
  attention; the context H_ctx = RMSNorm(W_c [H^{l1};…]) (layer id −1 is the embedding output) is
  projected by every layer's own k/v projections and k-norm; the block [x_a, MASK × (γ−1)] at
  positions a..a+γ−1 attends to the context < a and to itself, both ways. Its output h_k (after
  the final norm) gives U_k = lm_head(h_k); the Markov head adds W2·W1[x_{k−1}] (vanilla),
  W2·(g ⊙ W1[x_{k−1}]) with g = σ(W_g[h_k; W1[x_{k−1}]]) (gated) or a GRU-like state (rnn),
  sampled left to right from the anchor; the confidence head is wᵀ[h_k ; W1[x_{k−1}]] + b (or
  wᵀh_k + b), on the realised previous tokens.
- **DFlash** (the same architecture with `markov_rank = 0` and no confidence head): blocks are
  sampled position by position independently; the confidence is the logit of the top draft
  probability (vllm-ascend's proxy), of the sampling distribution at T > 0 and of softmax(U_k)
  at T = 0, where the sampling distribution is one-hot.
- **Eagle3** (`Qwen3Eagle3Model`, TTT): an autoregressive head. Its cache holds one entry per
  context position i < a built from (W_c[H_i], x_{i+1}) at RoPE position i, causal; step k feeds
  the previous step's pre-norm output with the embedding of the token just sampled at position
  a + k − 1, and its logits are lm_head(norm(·)). No confidence head: top-probability proxy as DFlash.

Modules, lowest first: `config` (read and write `config.json`), `models` (the three
architectures), `checkpoint` (tensor names, load and save), `hf_target` (a HuggingFace target
and the verification pass), `eval_sets` (DeepSpec's evaluation prompts), `recorder` (responses →
trace sets, STS) and `cli` (`python -m sparksim.drafter.deepspec check|record …`, which loads a
HuggingFace target and its tokenizer, regenerates its responses to DeepSpec's evaluation prompts
(chat template, thinking off), fits STS on a held-out split, and writes one trace set per drafter
and temperature through `sparksim.traces.format`; see docs/drafter.md, "Record your own drafter").
Nothing is imported here, so each module loads only what it needs.
"""
