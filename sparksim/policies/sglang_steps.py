"""`sglang-adaptive-steps`: SGLang's adaptive speculative step count (EMA with hysteresis).

Source: sgl-project/sglang, `python/sglang/srt/speculative/adaptive_spec_params.py` @
015c872628e328b530880bcf95ae91222604b225 (`AdaptiveStepSlot`, `DEFAULT_ADAPTIVE_CONFIG`),
`adaptive_step_router.py` @ a12239f6ac74d804d169ee5d3cfed3c49fa7162c; PRs #21599, #23336,
#24055 (`--speculative-adaptive`). Written for EAGLE chains (topk = 1), where a step count
s verifies s drafts; sparksim applies it to the trace's block, ℓ_r = min(s, γ) for all.

Rule, one slot per batch-size key (the largest configured key ≤ R; the smallest below all;
SGLang first pads R to its CUDA-graph batch size, which sparksim does not):
- After each step, unless s = 0, ema ← (1 − α)·ema + α·(mean accepted drafts per request);
  the EMA starts at s − 1. Decisions come after `warmup` steps (10), then every
  `interval` (5): at s = 0 it probes the next candidate up; else it steps down while
  ema ≤ prev − 0.5 + down (prev = 0: 0.5 + down), and otherwise up while ema > s − 0.5 + up.
- Defaults (DEFAULT_ADAPTIVE_CONFIG): key 1: [1, 3, 5, 7], up 0, down −0.25; key 8:
  [0, 1, 3]; key 32: [0, 1]; key 64: [0] (up = down = 0); α = 0.2; start at the middle
  candidate. s = 0 verifies nothing and skips the drafter (`drafts_at`); a pass-based
  drafter (mtp, autoregressive) drafts s positions and is priced for s (`positions_at`),
  a block drafter its whole block.
Lossless: ℓ reads only earlier steps' acceptances, never this step's confidences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sparksim.policies.base import Lengths, Policy, StepBatch, check_float, check_int
from sparksim.policies.path import cap_lengths

# key: (candidate step counts, up hysteresis, down hysteresis)
DEFAULT_SLOTS: dict[int, tuple[tuple[int, ...], float, float]] = {
    1: ((1, 3, 5, 7), 0.0, -0.25), 8: ((0, 1, 3), 0.0, 0.0), 32: ((0, 1), 0.0, 0.0), 64: ((0,), 0.0, 0.0),
}


@dataclass
class _Slot:
    candidates: tuple[int, ...]
    up: float
    down: float
    idx: int = 0
    ema: float = 0.0
    seen: int = 0

    def __post_init__(self) -> None:
        self.idx = len(self.candidates) // 2
        self.ema = self.candidates[self.idx] - 1.0

    @property
    def steps(self) -> int:
        return self.candidates[self.idx]

    def update(self, accepted: float, alpha: float, warmup: int, interval: int) -> None:
        if self.steps > 0:
            self.ema = (1.0 - alpha) * self.ema + alpha * accepted
        self.seen += 1
        if self.seen <= warmup or (self.seen - warmup) % interval:
            return
        if self.steps == 0:
            self.idx = min(self.idx + 1, len(self.candidates) - 1)
            return
        start = self.idx
        while self.idx > 0:
            prev = self.candidates[self.idx - 1]
            if self.ema <= (0.5 if prev == 0 else prev - 0.5) + self.down:
                self.idx -= 1
            else:
                break
        if self.idx == start:
            while self.idx < len(self.candidates) - 1 and self.ema > self.steps - 0.5 + self.up:
                self.idx += 1


class SglangAdaptiveSteps(Policy):
    name = "sglang-adaptive-steps"
    rule = "every request verifies s drafts; s moves by an EMA of acceptance with hysteresis (SGLang)"
    lossless = True
    paper = "SGLang adaptive_spec_params.py @ 015c872 (PRs #21599, #24055)"

    def __init__(self, block: int, alpha: float = 0.2, warmup: int = 10, interval: int = 5) -> None:
        super().__init__(block)
        self.alpha = check_float("alpha", alpha, 0.0, 1.0)
        self.warmup = check_int("warmup", warmup, 0)
        self.interval = check_int("interval", interval, 1)
        self._slots = {k: _Slot(c, up, down) for k, (c, up, down) in DEFAULT_SLOTS.items()}
        self._keys = np.array(sorted(self._slots))
        self._last: _Slot | None = None

    @property
    def params(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "warmup": self.warmup, "interval": self.interval}

    def _slot(self, requests: int) -> _Slot:
        i = max(int(np.searchsorted(self._keys, requests, side="right")) - 1, 0)
        return self._slots[int(self._keys[i])]

    def drafts_at(self, requests: int) -> bool:
        slot = self._slot(requests)
        if slot.steps > 0:
            return True
        slot.update(0.0, self.alpha, self.warmup, self.interval)  # a plain batch counts: it probes up
        self._last = None
        return False

    def positions_at(self, requests: int) -> int:
        """s: SGLang drafts s passes of a pass-based drafter (EAGLE, MTP), no more."""
        return min(self._slot(requests).steps, self.draft_positions)

    def decide(self, batch: StepBatch) -> Lengths:
        self._last = slot = self._slot(batch.num_requests)
        lengths = np.full(batch.num_requests, min(slot.steps, batch.gamma), dtype=np.int64)
        return cap_lengths(batch, lengths)

    def observe(self, batch: StepBatch, lengths: Lengths, num_accepted: NDArray[np.int64]) -> None:
        if self._last is not None and num_accepted.size:
            self._last.update(float(num_accepted.mean()), self.alpha, self.warmup, self.interval)
