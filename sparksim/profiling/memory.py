"""What a measured profile says about device memory: HBM, weights, KV per token, activations.

The simulator sizes its KV cache as HBM × utilisation − weights − activation reserve, in
units of KV bytes per token. On CUDA the profiler can measure all of it: the device's
memory, the weights it built, and the most memory any timed step allocated on top of the
weights, KV cache and inputs already resident (what an engine must keep free for
activations, CUDA-graph pools included). A CPU has no such budget worth modelling (the
machine's RAM is shared with everything else), so a CPU profile records none.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch

from sparksim.cost.models import ModelSpec
from sparksim.cost.roofline import DrafterShape
from sparksim.profiling.draft_model import DSparkDrafter
from sparksim.profiling.model import DecoderModel

# DSpark reuses the target's embedding and LM head; the profiler's drafter builds its own
# copies only so it can run alone, and a serving engine holds them once.
SHARED_WITH_TARGET = ("embed.", "lm_head.")


class PeakAbove:
    """Measure the peak CUDA memory a block allocates above what was allocated as it began.

    `bytes` is 0 on other devices, where there is no allocator to ask.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.base = 0
        self.bytes = 0

    def __enter__(self) -> PeakAbove:
        if self.cuda:
            torch.cuda.synchronize()
            self.base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.cuda and kind is None:
            torch.cuda.synchronize()
            self.bytes = max(0, torch.cuda.max_memory_allocated() - self.base)


def weights_bytes(spec: ModelSpec, drafter: DrafterShape | None, dtype_bytes: int) -> int:
    """Return the bytes of the target's parameters plus the drafter's own, in the dtype.

    Counted from the modules the profiler times, built on the meta device (no memory);
    tied and shared tensors count once.
    """
    with torch.device("meta"):
        target = DecoderModel(spec)
        if spec.tie_embeddings:
            target.lm_head.weight = target.embed.weight
        count = sum(p.numel() for p in target.parameters())  # parameters() skips tied repeats
        if drafter is not None:
            own = DSparkDrafter(spec, drafter)
            count += sum(p.numel() for name, p in own.named_parameters()
                         if not name.startswith(SHARED_WITH_TARGET))
    return int(count * dtype_bytes)


def memory_section(
    hbm_bytes: int, weights: int, kv_bytes_per_token: int, activation_bytes: int, *, graphs: bool,
) -> dict[str, Any]:
    """Return the card's `memory` mapping for a CUDA profile, each figure with its source."""
    return {
        "hbm_bytes": int(hbm_bytes),
        "weights_bytes": int(weights),
        "kv_bytes_per_token": int(kv_bytes_per_token),
        "activation_reserve_bytes": max(0, int(activation_bytes)),
        "source": "hbm_bytes: torch.cuda.get_device_properties(0).total_memory; weights: the "
                  "target's parameters and the drafter's own (embedding and LM head shared with "
                  "the target) x dtype bytes; kv per token: 2 x layers x kv_heads x head_dim x "
                  "dtype bytes; activation reserve: the largest torch.cuda.max_memory_allocated "
                  "of any timed verify or draft step minus what was allocated before it (weights, "
                  "KV cache, inputs)" + (", CUDA-graph pool included" if graphs else ""),
    }


CPU_MEMORY_NOTE = (
    "no memory section: a CPU profile does not measure a device memory budget (host RAM is "
    "shared with everything else on the machine), so the simulator's KV capacity is unlimited "
    "with this profile unless the scenario sets cluster.kv_capacity_tokens"
)
