"""Synthetic tasks, generated on the fly from a seed (nothing is downloaded).

Shapes: b prompts, N context examples, d input dimension.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RegressionPrompts:
    """In-context linear regression: y_i = w · x_i + noise, a fresh w per prompt."""

    x: torch.Tensor       # (b, N, d) context inputs
    y: torch.Tensor       # (b, N) context targets
    x_test: torch.Tensor  # (b, d) query input
    y_test: torch.Tensor  # (b,) its target
    w: torch.Tensor       # (b, d) the hidden weights


def in_context_regression(batch: int, n_context: int, d: int, *, noise: float = 0.0, seed: int = 0,
                          dtype: torch.dtype = torch.float64) -> RegressionPrompts:
    """Prompts of N (x, y) pairs from a random linear map w ~ N(0, I), x ~ N(0, I), plus a query."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(batch, d, generator=g, dtype=dtype)
    x = torch.randn(batch, n_context + 1, d, generator=g, dtype=dtype)
    y = torch.einsum("bnd,bd->bn", x, w) + noise * torch.randn(batch, n_context + 1, generator=g, dtype=dtype)
    return RegressionPrompts(x[:, :-1], y[:, :-1], x[:, -1], y[:, -1], w)
