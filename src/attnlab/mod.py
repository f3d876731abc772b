"""Mixture-of-Depths: a router lets only the top-k tokens of a sequence through a block.

Read alongside: Raposo et al. 2024, "Mixture-of-Depths: Dynamically allocating compute in
transformer-based language models" (expert-choice top-k routing with a fixed capacity, and
how they sample, where top-k over the whole sequence is not causal).

Routing is by *capacity*, not by a threshold: with capacity C (a fraction of the sequence), the
k = ⌈C L⌉ tokens with the largest router scores go through the block and the others skip it
along the residual stream. The compute is known in advance, which a threshold cannot promise.
The block's update is multiplied by the router score, so the router receives a gradient.

Shapes: x (b, L, d_model); scores (b, L); k the number of routed tokens per sequence.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from . import _checks
from .blocks import TransformerBlock


def routed_tokens(capacity: float, length: int) -> int:
    r"""k = ⌈C L⌉, the number of tokens a block processes for capacity C in (0, 1]."""
    if not 0 < capacity <= 1:
        raise ValueError(f"capacity must be in (0, 1], got {capacity}")
    return math.ceil(capacity * length)


def top_k_route(scores: torch.Tensor, k: int) -> torch.Tensor:
    r"""Indices of the k largest scores of each sequence, in increasing position order.

    .. math:: \mathcal R = \{\, t : r_t \ge P_{1 - k/L}(r) \,\}

    Sorting keeps the routed tokens in sequence order, so a causal block stays causal among them.
    Args: scores (b, L); 0 <= k <= L. Returns: (b, k) long.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must have shape (b, L), got {tuple(scores.shape)}")
    if not 0 <= k <= scores.shape[1]:
        raise ValueError(f"k must be between 0 and L={scores.shape[1]}, got {k}")
    return scores.topk(k, dim=-1).indices.sort(dim=-1).values


def block_flops_fraction(capacity: float, length: int, d_model: int) -> float:
    r"""Fraction of a block's matmul FLOPs spent with capacity C, against C = 1.

    Per token a block spends about :math:`24 d^2` on projections and feed-forward (linear in
    the routed tokens k) and :math:`4 k d` on attention scores and mixing (quadratic in k):

    .. math:: \frac{24 k d^2 + 4 k^2 d}{24 L d^2 + 4 L^2 d}, \quad k = \lceil C L \rceil

    The router itself (d per token) is left out.
    """
    _checks.at_least("block_flops_fraction", 1, length=length, d_model=d_model)
    k = routed_tokens(capacity, length)
    return (24 * k * d_model ** 2 + 4 * k * k * d_model) / (24 * length * d_model ** 2 + 4 * length * length * d_model)


class MixtureOfDepths(nn.Module):
    r"""A Transformer block applied only to the top-k routed tokens of each sequence.

    .. math:: x'_t = \begin{cases}
                  x_t + r_t\,\big(f(\tilde X)_t - x_t\big) & t \in \mathcal R \\
                  x_t & t \notin \mathcal R \end{cases}, \qquad r_t = x_t \cdot w_r

    where :math:`\tilde X` is the sequence of routed tokens and f the block (which
    includes its own residual, so f(X) - X is the block's update).
    """

    def __init__(self, d_model: int, n_heads: int, capacity: float, **block_kwargs):
        super().__init__()
        routed_tokens(capacity, 1)                               # validates capacity
        self.capacity = capacity
        self.router = nn.Linear(d_model, 1, bias=False)
        self.block = TransformerBlock(d_model, n_heads, **block_kwargs)

    def forward(self, x: torch.Tensor, *, causal: bool = True,
                return_routes: bool = False):
        """(b, L, d_model) -> (b, L, d_model); ``return_routes``: also routes (b, k)."""
        if x.dim() != 3:
            raise ValueError(f"x must have shape (b, L, d_model), got {tuple(x.shape)}")
        scores = self.router(x).squeeze(-1)                                    # (b, L)
        routes = top_k_route(scores, routed_tokens(self.capacity, x.shape[1]))  # (b, k)
        index = routes.unsqueeze(-1).expand(-1, -1, x.shape[-1])
        chosen = x.gather(1, index)                                    # (b, k, d_model)
        update = self.block(chosen, causal=causal) - chosen
        weight = scores.gather(1, routes).unsqueeze(-1)
        out = x.scatter_add(1, index, weight * update)
        return (out, routes) if return_routes else out
