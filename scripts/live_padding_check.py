"""Does the live engine pay for the longest context in its batch, or for the contexts' sum?

    python scripts/live_padding_check.py [--requests 8] [--rounds 6] [--replays 5]

Times `LiveBatch.decode` (the live engine's own plain-decoding step, one torch thread, the
shipped target) for batches of R requests whose contexts are all long, all short, mixed
(half short, half long: the long ones' padding) and all at the mixed batch's mean (the same
summed KV, no padding), interleaved over rounds, and prints each batch's median. A mixed
batch costing what the all-long one does means attention is padded to the longest context,
as the live profile's `attention_kv: padded` prices it (docs/fidelity.md §7).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from sparksim.live.engine import LiveBatch, LiveModels, LiveRequest
from sparksim.live.profile import _verify_all

TARGET = Path(__file__).resolve().parents[1] / "models" / "tinylm-d128-l6" / "target"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--short", type=int, default=64)
    ap.add_argument("--long", type=int, default=640)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--replays", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    models = LiveModels.load(TARGET, None)
    gen = torch.Generator().manual_seed(0)
    r, half = args.requests, args.requests // 2
    mixed = [args.short] * half + [args.long] * (r - half)
    mean = round(sum(c + 1 for c in mixed) / r) - 1
    cases = {f"all {args.long}": [args.long] * r, f"mixed {args.short}/{args.long}": mixed,
             f"all {mean} (mixed's sum)": [mean] * r, f"all {args.short}": [args.short] * r}
    batches = {}
    for name, contexts in cases.items():
        batch = LiveBatch(models, r, 0, temperature=1.0, max_new_tokens=1 << 30, seed=0)
        reqs = [LiveRequest(i, -1, 0, 0, 0.0, torch.randint(0, 256, (c,), generator=gen).tolist())
                for i, c in enumerate(contexts)]
        for req in reqs:
            batch.prefill([req], time.perf_counter)
        batches[name] = (batch, reqs, [q.tokens[0] for q in reqs], contexts)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (batch, reqs, first, contexts) in batches.items():
            batch.running, batch.positions, batch.dkv = reqs, 0, None
            for k in range(2 + args.replays):  # two warm-ups
                out = batch.decode(_verify_all)
                for req, tok, c in zip(reqs, first, contexts, strict=True):  # restore
                    req.length, req.tokens = c, [tok]
                if k >= 2:
                    times[name].append(out.verify_s * 1e3)
    for name, contexts in cases.items():
        summed, padded = sum(c + 1 for c in contexts), r * (max(contexts) + 1)
        print(f"{name:<26} KV summed {summed:>6}, padded {padded:>6}: median {np.median(times[name]):.3f} ms")


if __name__ == "__main__":
    main()
