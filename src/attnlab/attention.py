"""Scaled dot-product attention, its masks, and multi-head attention.

Read alongside: Vaswani et al. 2017, "Attention Is All You Need", section 3.2;
Ainslie et al. 2023, "GQA"; Shazeer 2019, "Fast Transformer Decoding" (MQA).

Shapes (see the package docstring for the glossary):
    q        (b, h, n, d)      queries
    k        (b, h_kv, m, d)   keys      (h_kv divides h)
    v        (b, h_kv, m, d_v) values
    mask     broadcastable to (b, h, n, m); bool (True = may attend) or float (added to scores)
    weights  (b, h, n, m)      each row a probability distribution over the m keys
    output   (b, h, n, d_v)

Any number of leading batch axes is allowed, as in torch; the head axis is the third from last.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from . import _checks
from .kv_cache import KVCache, LayerKVCache


def causal_mask(n: int, m: int | None = None, *, device=None) -> torch.Tensor:
    """Boolean causal mask of shape (n, m), True where query i may attend to key j.

    Aligned bottom-right: query i sees keys j <= i + (m - n). With n = m this is the
    lower triangle *including* the diagonal (a token sees itself). With n < m the n queries
    are the last n positions of the sequence, which is what decoding with a KV cache needs
    (FlashAttention aligns the same way; torch's ``is_causal=True`` aligns top-left).
    """
    m = n if m is None else m
    if n < 0 or m < 0:
        raise ValueError(f"causal_mask: lengths must be non-negative, got n={n}, m={m}")
    i = torch.arange(n, device=device).unsqueeze(-1)
    j = torch.arange(m, device=device)
    return j <= i + (m - n)


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fn: str = "scaled_dot_product_attention") -> None:
    """q, k, v: floating-point tensors of one dtype whose shapes fit together; ``fn`` names the caller."""
    _checks.floats(fn, q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() < 2:
            raise ValueError(f"{fn}: {name} must have shape (..., seq, dim), got shape {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{fn}: {name} must have q's dtype {q.dtype}, got {t.dtype}")
    if q.dim() != k.dim() or k.dim() != v.dim():
        raise ValueError(
            f"{fn}: q, k, v must have the same number of axes, got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"{fn}: q must have a head dimension d >= 1, got shape {tuple(q.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{fn}: k must have the same head dimension as q: q is {tuple(q.shape)}, "
            f"so k needs (..., m, {q.shape[-1]}), got {tuple(k.shape)}"
        )
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"{fn}: v must have k's shape except the last axis: k is {tuple(k.shape)}, "
            f"so v needs {tuple(k.shape[:-1]) + ('d_v',)}, got {tuple(v.shape)}"
        )
    if q.shape[:-3] != k.shape[:-3]:
        raise ValueError(
            f"{fn}: q and k must share batch axes: q is {tuple(q.shape)}, k is {tuple(k.shape)}"
        )
    if q.dim() >= 3 and (k.shape[-3] == 0 or q.shape[-3] % k.shape[-3] != 0):
        raise ValueError(
            f"{fn}: k must have a number of heads that divides q's ({q.shape[-3]}): "
            f"q is {tuple(q.shape)}, k is {tuple(k.shape)}"
        )


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Repeat each key/value head ``n_rep`` times: (..., h_kv, m, d) -> (..., h_kv * n_rep, m, d).

    Query head i then reads key/value head i // n_rep, the grouping torch uses for
    ``enable_gqa=True``.
    """
    _checks.ints("repeat_kv", n_rep=n_rep)
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=-3)


def _check_mask(mask: torch.Tensor, scores_shape: torch.Size) -> None:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
    try:
        broadcast = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != scores_shape:
        n, m = scores_shape[-2], scores_shape[-1]
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape "
            f"{tuple(scores_shape)}; its last two axes must be (n, m) = ({n}, {m}) or 1, "
            f"for example ({n}, {m}) or (b, 1, {n}, {m})"
        )


def masked_scores(
    scores: torch.Tensor, mask: torch.Tensor | None = None, *, causal: bool = False
) -> torch.Tensor:
    """Apply a mask to raw scores (..., n, m): blocked positions become -inf.

    A boolean ``mask`` blocks where it is False; a float mask is added (use -inf to block).
    ``causal`` adds the bottom-right causal mask of :func:`causal_mask`.
    """
    if mask is not None:
        _check_mask(mask, scores.shape)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(scores.dtype)
    if causal:
        n, m = scores.shape[-2:]
        scores = scores.masked_fill(~causal_mask(n, m, device=scores.device), float("-inf"))
    return scores


def masked_softmax(scores: torch.Tensor) -> torch.Tensor:
    r"""Softmax over the last axis in which a row with no allowed key gives zeros, not NaN.

    .. math:: a_j = \frac{e^{s_j - \max_i s_i}}{\sum_i e^{s_i - \max_i s_i}}

    Subtracting the row maximum (done inside ``torch.softmax``) keeps the exponentials
    finite. A row whose scores are all -inf has no finite maximum to subtract, and a plain
    softmax would return NaN for it. Such a row's scores are set to 0 before ``torch.softmax``
    (which then returns a uniform row there) and its weights are set to 0 afterwards, so the
    output of a fully masked query is the zero vector. Rows with at least one allowed key are
    untouched.
    """
    blocked = torch.isneginf(scores).all(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(blocked, 0.0), dim=-1)
    return weights.masked_fill(blocked, 0.0)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
):
    r"""Scaled dot-product attention, written out.

    .. math:: \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\Big(\frac{QK^\top}{\sqrt{d}} + M\Big)V

    Args:
        q: (b, h, n, d) queries.
        k: (b, h_kv, m, d) keys; h_kv must divide h (grouped-query attention when h_kv < h).
        v: (b, h_kv, m, d_v) values.
        mask: None, or broadcastable to (b, h, n, m): bool with True = may attend, or a
            float mask added to the scores.
        causal: also apply the bottom-right aligned causal mask (query i sees keys
            j <= i + m - n).
        scale: multiplies the scores; default 1 / sqrt(d).
        dropout_p: probability of zeroing each weight before the weights multiply V; the
            kept weights are divided by 1 - dropout_p. Applied on every call with
            dropout_p > 0, in training and evaluation alike: pass 0 for evaluation
            (:class:`MultiHeadAttention` does so when it is not training). The weights
            *returned* are the pre-dropout ones, so their rows still sum to 1.
        return_weights: also return the (b, h, n, m) attention weights.

    Returns:
        output (b, h, n, d_v), and the weights if ``return_weights``. A query with no key it
        may attend to gets weights 0 and output 0.

    Raises: TypeError if q, k, v are not floating-point tensors of one dtype; ValueError, naming
    the argument, if their shapes do not fit together or the mask does not broadcast.
    """
    _check_shapes(q, k, v)
    if q.dim() >= 3:
        n_rep = q.shape[-3] // k.shape[-3]
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if mask is None and not causal:
        weights = torch.softmax(scores, dim=-1)  # no key is blocked: no empty row to guard
    else:
        weights = masked_softmax(masked_scores(scores, mask, causal=causal))
    mixing = torch.dropout(weights, dropout_p, train=True) if dropout_p > 0 else weights
    out = mixing @ v
    return (out, weights) if return_weights else out


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    r"""Shannon entropy of each attention row, in nats: (..., n, m) -> (..., n).

    .. math:: H(a) = -\sum_j a_j \log a_j, \quad 0 \log 0 = 0

    It is log m for a uniform row over m keys and 0 for a one-hot row.
    """
    logs = torch.where(weights > 0, weights.log(), torch.zeros_like(weights))
    return -(weights * logs).sum(dim=-1)


def softmax_jacobian(weights: torch.Tensor) -> torch.Tensor:
    r"""Jacobian of the softmax at its output a: (..., m) -> (..., m, m).

    .. math:: \frac{\partial a_i}{\partial s_j} = a_i(\delta_{ij} - a_j), \quad J = \mathrm{diag}(a) - a a^\top

    Its spectral norm is 1/m for a uniform row over m keys, where J = (I - 1 1^T / m) / m, and
    tends to 0 as the row approaches one-hot; it is largest in between.
    """
    return torch.diag_embed(weights) - weights.unsqueeze(-1) * weights.unsqueeze(-2)


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention with h query heads and h_kv key/value heads.

    .. math:: \mathrm{MHA}(X, Y) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\,W^O,
              \quad \mathrm{head}_i = \mathrm{Attention}(X W^Q_i,\; Y W^K_{g(i)},\; Y W^V_{g(i)})

    with g(i) = i // (h / h_kv): h_kv = h is MHA, 1 < h_kv < h is GQA, h_kv = 1 is MQA.
    Y = X is self-attention; Y = ``context`` is cross-attention.

    Parameters: 2 d_model^2 (W^Q, W^O) + 2 d_model * h_kv * d (W^K, W^V), which is
    4 d_model^2 for MHA, plus 2 d_model + 2 h_kv d with ``bias`` (4 d_model for MHA).
    The module is pure attention: normalisation and the residual belong to the block.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        bias: bool = False,
        dropout: float = 0.0,
    ):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        _checks.ints("MultiHeadAttention", d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads)
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads})")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)

    def split_heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        """(b, L, n_heads * d) -> (b, n_heads, L, d)."""
        b, length, _ = x.shape
        return x.view(b, length, n_heads, self.head_dim).transpose(1, 2)

    @staticmethod
    def merge_heads(x: torch.Tensor) -> torch.Tensor:
        """(b, h, L, d) -> (b, L, h * d), the inverse of :meth:`split_heads`."""
        b, h, length, d = x.shape
        return x.transpose(1, 2).reshape(b, length, h * d)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        *,
        causal: bool = False,
        cache=None,
        context_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        return_weights: bool = False,
    ):
        """Args:
            x: (b, n, d_model), the sequence the queries come from.
            context: (b, m, d_model) for cross-attention; default ``x`` (self-attention).
            mask: broadcastable to (b, h, n, m), as in :func:`scaled_dot_product_attention`.
            causal: apply the bottom-right causal mask.
            cache: a :class:`attnlab.kv_cache.LayerKVCache` (or a one-layer ``KVCache``) for
                self-attention while decoding: the n new tokens' keys and values are appended
                to it and the queries attend to all m = t cached positions. With ``causal``
                the bottom-right alignment makes new token i see positions j <= t - n + i.
            context_kv: the cross-attention keys and values of a fixed context, as returned by
                :meth:`context_kv` (each (b, h_kv, m, d)): computed once, e.g. from an
                encoder's output, and reused at every decoding step instead of ``context``.
            return_weights: also return the (b, h, n, m) weights (pre-dropout).

        Returns: (b, n, d_model), and the weights if requested.
        """
        if cache is not None and (context is not None or context_kv is not None):
            raise ValueError("cache is for self-attention; for cross-attention compute the context's keys and "
                             "values once with context_kv(context) and pass them as context_kv=(k, v)")
        if context is not None and context_kv is not None:
            raise ValueError("pass context or context_kv (its keys and values, computed once), not both")
        context = x if context is None else context
        for name, t in (("x", x), ("context", context)):
            if t.dim() != 3 or t.shape[-1] != self.q_proj.in_features:
                raise ValueError(
                    f"{name} must have shape (b, seq, d_model={self.q_proj.in_features}), "
                    f"got {tuple(t.shape)}"
                )
        q = self.split_heads(self.q_proj(x), self.n_heads)
        if context_kv is not None:
            k, v = self._check_context_kv(context_kv, x.shape[0])
        else:
            k, v = self.context_kv(context)
        if cache is not None:
            k, v = _layer_cache(cache).append(k, v)
        out, weights = scaled_dot_product_attention(
            q, k, v, mask, causal=causal, return_weights=True,
            dropout_p=self.dropout if self.training else 0.0,
        )
        out = self.out_proj(self.merge_heads(out))
        return (out, weights) if return_weights else out

    def context_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Keys and values of a context: (b, m, d_model) -> K, V, each (b, h_kv, m, d).

        .. math:: K = Y W^K, \qquad V = Y W^V, \qquad \text{split into } h_{kv} \text{ heads}

        In cross-attention Y is fixed (an encoder's output) while the decoder writes, so K and V
        are the same at every step: compute them once and pass ``context_kv=(K, V)`` to
        :meth:`forward`, which then skips both projections. This is the cross-attention cache.
        """
        if not isinstance(context, torch.Tensor) or context.dim() != 3 or context.shape[-1] != self.k_proj.in_features:
            got = tuple(context.shape) if isinstance(context, torch.Tensor) else type(context).__name__
            raise ValueError(f"context must have shape (b, m, d_model={self.k_proj.in_features}), got {got}")
        return (self.split_heads(self.k_proj(context), self.n_kv_heads),
                self.split_heads(self.v_proj(context), self.n_kv_heads))

    def _check_context_kv(self, context_kv, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not (isinstance(context_kv, (tuple, list)) and len(context_kv) == 2
                and all(isinstance(t, torch.Tensor) for t in context_kv)):
            raise TypeError(f"context_kv must be a pair of tensors (k, v) from context_kv(context), "
                            f"got {type(context_kv).__name__}")
        k, v = context_kv
        want = (batch, self.n_kv_heads, k.shape[2] if k.dim() == 4 else "m", self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 4 or (t.shape[0], t.shape[1], t.shape[3]) != (batch, self.n_kv_heads, self.head_dim) \
                    or t.shape[2] != k.shape[2]:
                raise ValueError(f"context_kv's {name} must have shape (b, h_kv, m, d) = {want}, "
                                 f"got {tuple(t.shape)}")
        return k, v


def _layer_cache(cache):
    """The one layer's cache a MultiHeadAttention writes to (a KVCache must have one layer)."""
    if isinstance(cache, KVCache):
        if len(cache) != 1:
            raise ValueError(f"cache has {len(cache)} layers; pass one layer's cache, cache[i], to layer i")
        return cache[0]
    if not isinstance(cache, LayerKVCache):
        raise TypeError(f"cache must be a LayerKVCache or KVCache, got {type(cache).__name__}")
    return cache


def uniform_entropy(n: int, *, causal: bool = True) -> torch.Tensor:
    r"""Entropy of uniform attention for each of n queries, in nats: (n,) float64.

    .. math:: H_i = \log |\{j : \text{query } i \text{ may attend to } j\}| =
              \begin{cases} \log i & \text{causal, query } i = 1, \dots, n \\ \log n & \text{bidirectional} \end{cases}

    The baseline a trained causal model's entropy should be compared with is the mean,
    :math:`\frac1n \sum_{i=1}^n \log i = \frac{\log n!}{n}` (3.88 at n = 128), not log n (4.85).
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    keys = torch.arange(1, n + 1, dtype=torch.float64) if causal else torch.full((n,), float(n), dtype=torch.float64)
    return keys.log()
