"""Differential attention: the difference of two softmax maps cancels common-mode noise.

Read alongside: Ye, Dong, Xia, Sun, Zhu, Huang, Wei 2025, "Differential Transformer"
(ICLR; arXiv 2410.05258), section 2.1 (the differential map, the λ re-parameterisation
and its initialisation) and 2.2 (multi-head: per-head RMSNorm, the 1 - λ_init scale,
one shared V).

Shapes (see the package docstring for the glossary):
    q1, q2   (b, h, n, d)     two query groups per head
    k1, k2   (b, h, m, d)     two key groups per head
    v        (b, h, m, d_v)   one value group shared by both maps (d_v = 2 d in the paper)
    weights  (b, h, n, m)     the differential map A_1 - λ A_2; each row sums to 1 - λ
    x        (b, L, d_model)  the residual stream; h = d_model / (2 d) differential heads

A differential head uses twice the query/key width of a standard head of the same
d_model, so a differential layer with h heads has the same projection sizes as a
standard one with 2h heads.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import _checks
from .attention import (
    MultiHeadAttention, attention_entropy, scaled_dot_product_attention,
)
from .blocks import RMSNorm


def lambda_init(layer: int) -> float:
    r"""The paper's depth schedule for λ's initial value, with layers counted from 1.

    .. math:: \lambda_{\mathrm{init}}(l) = 0.8 - 0.6\, e^{-0.3 (l - 1)}

    0.2 in the first layer, rising towards 0.8 in deep layers.
    """
    if not isinstance(layer, int) or layer < 1:
        raise ValueError(f"layer is counted from 1, got {layer!r}")
    return 0.8 - 0.6 * math.exp(-0.3 * (layer - 1))


def reparameterised_lambda(lq1: torch.Tensor, lk1: torch.Tensor, lq2: torch.Tensor,
                           lk2: torch.Tensor, init: float) -> torch.Tensor:
    r"""λ from four learnable vectors, so that its gradient is well scaled.

    .. math:: \lambda = e^{\lambda_{q1} \cdot \lambda_{k1}}
              - e^{\lambda_{q2} \cdot \lambda_{k2}} + \lambda_{\mathrm{init}}

    lq1, lk1, lq2, lk2: (d,) -> a scalar tensor. With all four vectors zero, λ = λ_init.
    """
    for name, t in (("lq1", lq1), ("lk1", lk1), ("lq2", lq2), ("lk2", lk2)):
        if t.dim() != 1 or t.shape != lq1.shape:
            raise ValueError(f"{name} must have shape (d,) = {tuple(lq1.shape)}, "
                             f"got {tuple(t.shape)}")
    return torch.exp(lq1 @ lk1) - torch.exp(lq2 @ lk2) + init


def differential_attention(q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor,
                           k2: torch.Tensor, v: torch.Tensor, lam,
                           mask: torch.Tensor | None = None, *, causal: bool = False,
                           scale: float | None = None, return_weights: bool = False):
    r"""The differential map applied to one shared V (Ye et al., eq. 1).

    .. math:: \mathrm{DiffAttn} = \Big(\mathrm{softmax}\big(\tfrac{Q_1K_1^\top}{\sqrt d}\big)
              - \lambda\, \mathrm{softmax}\big(\tfrac{Q_2K_2^\top}{\sqrt d}\big)\Big) V

    Args:
        q1, q2: (b, h, n, d); k1, k2: (b, h, m, d); v: (b, h, m, d_v).
        lam: a float or a tensor broadcastable to (b, h, 1, 1).
        mask, causal, scale: as in
            :func:`attnlab.attention.scaled_dot_product_attention`, applied to both maps.
        return_weights: also return the (b, h, n, m) differential weights A_1 - λ A_2.

    With λ = 0 it is standard attention with (q1, k1, v).
    """
    if q1.shape != q2.shape or k1.shape != k2.shape:
        raise ValueError(f"q2 must match q1 {tuple(q1.shape)} and k2 must match k1 "
                         f"{tuple(k1.shape)}; got q2 {tuple(q2.shape)}, "
                         f"k2 {tuple(k2.shape)}")
    out1, a1 = scaled_dot_product_attention(q1, k1, v, mask, causal=causal, scale=scale,
                                            return_weights=True)
    out2, a2 = scaled_dot_product_attention(q2, k2, v, mask, causal=causal, scale=scale,
                                            return_weights=True)
    out = out1 - lam * out2
    return (out, a1 - lam * a2) if return_weights else out


class DifferentialAttention(nn.Module):
    r"""Multi-head differential attention (Ye et al., section 2.2).

    .. math:: \mathrm{head}_i = (1 - \lambda_{\mathrm{init}})\,
              \mathrm{RMSNorm}\big(\mathrm{DiffAttn}(X W^Q_i, X W^K_i, X W^V_i;
              \lambda)\big), \quad
              \mathrm{MultiHead}(X) = \mathrm{Concat}(\mathrm{head}_1, \dots,
              \mathrm{head}_h)\, W^O

    Each head has d = d_model / (2 h): its queries and keys split into two groups of
    width d, its value has width 2 d, shared by both maps. λ is shared by the heads of a
    layer and re-parameterised (:func:`reparameterised_lambda`) around
    :func:`lambda_init` of ``layer``. The RMSNorm normalises each head on its own
    (GroupNorm with one group per head). The fixed multiplier (1 - λ_init) is there, in
    Ye et al.'s words (§2.2), to align the gradient flow with that of the Transformer.
    Parameters: 4 d_model^2 (as standard multi-head attention) + 4 d + 2 d.

    ``lambda_mode`` is for ablations: "learned" (the paper), "fixed" (λ = λ_init, the
    four vectors zero and frozen) or "zero" (λ = 0: each head is one softmax map, with
    the same widths, norm and scale).
    """

    LAMBDA_MODES = ("learned", "fixed", "zero")

    def __init__(self, d_model: int, n_heads: int, layer: int = 1, *,
                 bias: bool = False, lambda_mode: str = "learned"):
        super().__init__()
        _checks.ints("DifferentialAttention", d_model=d_model, n_heads=n_heads)
        if d_model % (2 * n_heads) != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by 2 * n_heads "
                             f"({2 * n_heads})")
        if lambda_mode not in self.LAMBDA_MODES:
            raise ValueError(f"lambda_mode must be one of {self.LAMBDA_MODES}, "
                             f"got {lambda_mode!r}")
        self.lambda_mode = lambda_mode
        self.n_heads, self.head_dim = n_heads, d_model // (2 * n_heads)
        self.lambda_init = lambda_init(layer)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(0.1 * torch.randn(self.head_dim)) for _ in range(4))
        self.head_norm = RMSNorm(2 * self.head_dim, eps=1e-5)
        if lambda_mode != "learned":
            for vec in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
                vec.data.zero_()
                vec.requires_grad_(False)

    def lam(self) -> torch.Tensor:
        """The current λ (a scalar tensor)."""
        if self.lambda_mode == "zero":
            return torch.zeros((), dtype=self.lambda_q1.dtype,
                               device=self.lambda_q1.device)
        return reparameterised_lambda(self.lambda_q1, self.lambda_k1, self.lambda_q2,
                                      self.lambda_k2, self.lambda_init)

    def heads(self, x: torch.Tensor, mask: torch.Tensor | None = None, *,
              causal: bool = False, return_weights: bool = False):
        """The normalised, scaled heads before W^O: x (b, L, d_model) -> (b, h, L, 2 d).

        With ``return_weights`` also the differential maps A_1 - λ A_2, (b, h, L, L).
        """
        if x.dim() != 3 or x.shape[-1] != self.q_proj.in_features:
            raise ValueError(f"x must have shape (b, L, d_model="
                             f"{self.q_proj.in_features}), got {tuple(x.shape)}")
        b, length, _ = x.shape
        h, d = self.n_heads, self.head_dim
        # queries and keys: (b, L, h, 2, d) -> two groups of (b, h, L, d)
        q = self.q_proj(x).view(b, length, h, 2, d).permute(3, 0, 2, 1, 4)
        k = self.k_proj(x).view(b, length, h, 2, d).permute(3, 0, 2, 1, 4)
        v = self.v_proj(x).view(b, length, h, 2 * d).transpose(1, 2)
        out, diff = differential_attention(q[0], k[0], q[1], k[1], v, self.lam(), mask,
                                           causal=causal, return_weights=True)
        out = (1 - self.lambda_init) * self.head_norm(out)
        return (out, diff) if return_weights else out

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *,
                causal: bool = False, return_weights: bool = False):
        """x: (b, L, d_model) -> (b, L, d_model); with ``return_weights`` also the
        differential maps (b, h, L, L)."""
        out, diff = self.heads(x, mask, causal=causal, return_weights=True)
        b, h, length, width = out.shape
        y = self.out_proj(out.transpose(1, 2).reshape(b, length, h * width))
        return (y, diff) if return_weights else y


def attention_on_target(weights: torch.Tensor,
                        target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""How much of a row's attention lands on one position, and how spread the row is.

    A differential row can have negative entries and sums to 1 - λ, so both measures use
    the row's magnitude normalised to a distribution,
    :math:`\tilde a_j = |a_j| / \sum_i |a_i|` (for a softmax row, :math:`\tilde a = a`):

    .. math:: \mathrm{share} = \tilde a_{t}, \qquad H = -\sum_j \tilde a_j \log \tilde a_j

    A negative weight on a distractor counts here as attention away from the target.
    weights: (b, h, m) rows, one per example and head; target: (b,) long positions in
    [0, m). Returns (share, entropy), each (b, h).
    """
    if weights.dim() != 3 or target.shape != weights.shape[:1]:
        raise ValueError(f"weights must be (b, h, m) and target (b,); got "
                         f"{tuple(weights.shape)} and {tuple(target.shape)}")
    mags = weights.abs()
    dist = mags / mags.sum(-1, keepdim=True).clamp_min(torch.finfo(mags.dtype).tiny)
    index = target.view(-1, 1, 1).expand(-1, weights.shape[1], 1)
    return dist.gather(-1, index).squeeze(-1), attention_entropy(dist)


class RetrievalModel(nn.Module):
    """One attention layer that reads a query key and answers from the matching pair.

    Token ids as in :func:`attnlab.tasks.key_value_retrieval`: a pair token
    ``key * n_values + value`` is embedded as E_key[key] + E_value[value], a query token
    as E_query[key]. Then [standard | differential] causal attention with a residual,
    RMSNorm, and a linear readout of the last (query) position: logits (b, n_values).
    Retrieval is by content, so there is no position embedding. ``attention="standard"``
    uses :class:`attnlab.attention.MultiHeadAttention` with 2 h heads (or
    ``standard_heads``), ``"differential"`` :class:`DifferentialAttention` with h heads
    and ``lambda_mode``: the same projection sizes.

    group_size > 1 embeds key k (in a pair and in the query) as the sum of a group part
    (k // group_size) and a member part (k % group_size), so keys of one group are near
    duplicates (see :func:`attnlab.tasks.key_value_retrieval`).
    """

    def __init__(self, n_keys: int, n_values: int, d_model: int = 64, n_heads: int = 2,
                 attention: str = "standard", *, standard_heads: int | None = None,
                 lambda_mode: str = "learned", group_size: int = 1):
        super().__init__()
        if attention not in ("standard", "differential"):
            raise ValueError(f"attention must be 'standard' or 'differential', "
                             f"got {attention!r}")
        if group_size < 1 or n_keys % group_size:
            raise ValueError(f"group_size must be >= 1 and divide n_keys={n_keys}, "
                             f"got {group_size}")
        self.kind, self.n_keys, self.n_values = attention, n_keys, n_values
        self.group_size = group_size
        self.key_embed = nn.Embedding(n_keys, d_model)
        self.value_embed = nn.Embedding(n_values, d_model)
        self.query_embed = nn.Embedding(n_keys, d_model)
        if group_size > 1:
            self.key_group = nn.Embedding(n_keys // group_size, d_model)
            self.query_group = nn.Embedding(n_keys // group_size, d_model)
            self.key_embed = nn.Embedding(group_size, d_model)
            self.query_embed = nn.Embedding(group_size, d_model)
        heads = 2 * n_heads if standard_heads is None else standard_heads
        self.attn = (MultiHeadAttention(d_model, heads) if attention == "standard"
                     else DifferentialAttention(d_model, n_heads, layer=1,
                                                lambda_mode=lambda_mode))
        self.norm = RMSNorm(d_model)
        self.readout = nn.Linear(d_model, n_values)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (b, L) long -> (b, L, d_model)."""
        pairs = self.n_keys * self.n_values
        is_query = tokens >= pairs
        pair_ids = tokens.clamp_max(pairs - 1)
        key = pair_ids // self.n_values
        query_key = (tokens - pairs).clamp(0, self.n_keys - 1)
        if self.group_size > 1:
            size = self.group_size
            pair = self.key_group(key // size) + self.key_embed(key % size)
            query = self.query_group(query_key // size) + self.query_embed(query_key % size)
        else:
            pair, query = self.key_embed(key), self.query_embed(query_key)
        pair = pair + self.value_embed(pair_ids % self.n_values)
        return torch.where(is_query.unsqueeze(-1), query, pair)

    def forward(self, tokens: torch.Tensor, *, return_weights: bool = False):
        """tokens: (b, L) long -> logits (b, n_values); with ``return_weights`` also the
        last query's weights (b, h, L)."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape (b, L), got {tuple(tokens.shape)}")
        x = self.embed(tokens)
        mixed, weights = self.attn(x, causal=True, return_weights=True)
        logits = self.readout(self.norm(x + mixed)[:, -1])
        return (logits, weights[:, :, -1]) if return_weights else logits


def retrieval_loss(model: nn.Module, tokens: torch.Tensor,
                   targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the query's answer: model(tokens) (b, n_out) against targets (b,)."""
    logits = model(tokens)
    if targets.shape != logits.shape[:1]:
        raise ValueError(f"retrieval_loss: targets must have shape (b,) = "
                         f"({logits.shape[0]},), got {tuple(targets.shape)}")
    return F.cross_entropy(logits, targets)
