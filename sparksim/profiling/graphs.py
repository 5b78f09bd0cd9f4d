"""CUDA graphs, one per captured batch size, the way vLLM serves decode steps.

A graph replays a whole step's kernels with one launch, so small steps stop paying
per-kernel launch overhead. An engine captures a fixed list of sizes and pads every batch
up to the next one (121 tokens run the 128-token graph); that padding is what makes real
step cost a staircase, and running past the largest captured size falls back to eager
launches: the cliff.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any


def default_capture_sizes(max_size: int = 512) -> list[int]:
    """Return vLLM's default capture sizes up to `max_size` (the roofline's rule, as a list)."""
    from sparksim.cost.roofline import default_capture_sizes as sizes

    return list(sizes(max_size))


def padded_size(tokens: int, capture_sizes: Sequence[int]) -> int | None:
    """Return the captured size a batch of `tokens` runs as, or None if it runs eagerly."""
    sizes = sorted(capture_sizes)
    i = bisect.bisect_left(sizes, tokens)
    return sizes[i] if i < len(sizes) else None


def capture(run: Callable[[], object], pool: Any = None, warmup: int = 3) -> Callable[[], None]:
    """Capture `run` into a CUDA graph and return a function that replays it.

    `run` must read only tensors that outlive the graph (inputs, layout, KV cache); its
    intermediates live in the graph's memory `pool`, shared between graphs as vLLM does.
    Warm-up runs on a side stream first so lazy initialisation (cuBLAS handles, autotuning)
    happens outside the capture.
    """
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        run()
    return graph.replay
