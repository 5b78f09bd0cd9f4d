"""Holds how a CUDA-graph engine runs a batch: vLLM's capture sizes, padding, the eager pass.

Inside the CUDA-graph capture sizes a batch replays the graph of the next captured size (a
staircase); past the largest one the step runs eagerly, and launching its kernels from the
CPU overlaps their GPU work: it costs the larger of the two (a cliff only where the kernels
are shorter than their launches). The target's step (`target_step.graph_verify_ms`) and the
drafters' (`draft_step.graph_draft_ms`) both run this way. docs/profiles.md derives it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray


def default_capture_sizes(max_size: int = 512) -> tuple[int, ...]:
    """Return vLLM's default CUDA-graph capture sizes up to `max_size` tokens.

    1, 2, 4, then multiples of 8 up to 256, then multiples of 16 (vLLM's
    `cudagraph_capture_sizes` default with max_num_seqs ≥ 256).
    """
    sizes = [1, 2, 4, *range(8, 257, 8), *range(272, max_size + 1, 16)]
    return tuple(s for s in sizes if s <= max_size)


def pad_to_capture(
    tokens: ArrayLike, capture_sizes: Sequence[int]
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Return (padded size, runs eagerly) for each batch in `tokens`.

    A batch at or below the largest captured size replays the graph of the next captured
    size; a larger batch (or any batch when nothing is captured) runs eagerly, unpadded.
    """
    t = np.asarray(tokens, dtype=np.float64)
    if not capture_sizes:
        return t.copy(), np.ones(t.shape, dtype=bool)
    sizes = np.asarray(sorted(capture_sizes), dtype=np.float64)
    eager = t > sizes[-1]
    idx = np.minimum(np.searchsorted(sizes, t, side="left"), sizes.size - 1)
    return np.where(eager, t, sizes[idx]), eager


def eager_step_ms(gpu_ms: ArrayLike, dispatch_ms: ArrayLike) -> NDArray[np.float64]:
    """Return the time of an eager forward pass whose kernels take `gpu_ms` on the GPU and
    `dispatch_ms` to launch from the CPU: the larger of the two.

    Launches are asynchronous: the CPU queues kernel i+1 while the GPU runs kernel i, so a
    pass is bound by whichever side is slower in total, the GPU's work (long kernels: the
    launch queue runs ahead and its cost hides) or the CPU's dispatch (short kernels: the
    GPU idles between launches). The exact time of kernels g_1..g_n launched every `l` is
    max over k of (k·l + g_k + … + g_n), between max(Σg, n·l) and max(Σg, n·l) + max g;
    this takes the lower end, exact when no single kernel dominates. CUDA graphs replace
    the launches by one replay, so graph steps pay no dispatch.
    """
    return np.maximum(np.asarray(gpu_ms, dtype=np.float64), np.asarray(dispatch_ms, dtype=np.float64))
