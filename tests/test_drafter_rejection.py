"""Exact rejection sampling: the emitted token is distributed as the target's, and acceptance is 1 − TV."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from scipy.stats import chisquare  # noqa: E402

from sparksim.drafter.record import resample, verify  # noqa: E402


def test_rejection_sampling_reproduces_the_target_distribution_on_a_tiny_vocabulary() -> None:
    """Lossless speculative decoding is the premise of every recorded acceptance; check it statistically."""
    gen = torch.Generator().manual_seed(0)
    n = 60000
    p_t = torch.tensor([0.5, 0.3, 0.15, 0.05]).expand(n, 1, 4)
    p_d = torch.tensor([0.1, 0.2, 0.3, 0.4]).expand(n, 1, 4)
    x = torch.multinomial(p_d[:, 0], 1, generator=gen)  # (n, 1) drafts
    acc = verify(p_t, p_d, x, gen)  # (n,)
    out = torch.where(acc == 1, x[:, 0], resample(p_t[:, 0], p_d[:, 0], gen))
    counts = np.bincount(out.numpy(), minlength=4)
    assert chisquare(counts, n * p_t[0, 0].numpy()).pvalue > 1e-3
    tv = 0.5 * (p_t[0, 0] - p_d[0, 0]).abs().sum().item()
    assert abs(acc.float().mean().item() - (1 - tv)) < 0.01


def test_accepted_count_stops_at_the_first_rejection() -> None:
    """`accepted` is a prefix length: a later certain acceptance cannot follow a certain rejection."""
    p_t = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]])  # (1, γ=3, V=2)
    p_d = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]])
    tokens = torch.tensor([[0, 0, 0]])
    assert verify(p_t, p_d, tokens, None).tolist() == [1]
