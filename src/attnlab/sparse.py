"""Sparse attention: which keys each query may see, and a sliding-window kernel that costs O(n·w).

Read alongside: Child et al. 2019, "Generating Long Sequences with Sparse Transformers"
(the strided pattern; its "fixed" pattern is not implemented here); Beltagy et al. 2020,
"Longformer" (sliding window, dilation, global tokens); Zaheer et al. 2020, "Big Bird"
(window + global + random).

Masks are boolean (n, n), True = may attend, row = query i, column = key j.
A window w means: bidirectional, |i - j| <= w (2w + 1 keys); causal, i - w <= j <= i.

What hardware computes is tiles: :func:`tile_classes` sorts the (B × B) tiles of a mask into
empty, partial and full, as a block-sparse kernel (or FlexAttention's block mask, Dong et al.
2024) does, and :func:`window_tiles` counts the tiles the blocked window kernel visits.
"""
from __future__ import annotations

import math

import torch

from . import _checks
from .attention import _check_shapes


def _offsets(n: int) -> torch.Tensor:
    """(n, n) matrix of i - j."""
    idx = torch.arange(n)
    return idx.unsqueeze(-1) - idx


def _in_window(offset: torch.Tensor, window: int, causal: bool) -> torch.Tensor:
    """Which query - key offsets i - j a window allows: |i - j| <= w, or 0 <= i - j <= w if causal."""
    return (offset >= 0) & (offset <= window) if causal else offset.abs() <= window


def _check_mask(fn: str, mask: torch.Tensor) -> None:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"{fn}: mask must be a boolean tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
    if mask.dim() != 2 or mask.shape[0] != mask.shape[1]:
        raise ValueError(f"{fn}: mask must have shape (n, n), got {tuple(mask.shape)}")


def sliding_window_mask(n: int, window: int, *, causal: bool = False) -> torch.Tensor:
    """Each query sees the keys within ``window`` positions (only earlier ones if causal).

    Raises ValueError if n or window is negative.
    """
    _checks.ints("sliding_window_mask", n=n, window=window, minimum=0)
    return _in_window(_offsets(n), window, causal)


def dilated_window_mask(n: int, window: int, dilation: int, *, causal: bool = False) -> torch.Tensor:
    """A window with gaps: keys at offsets 0, ±r, ±2r, ..., ±w·r (Longformer's dilated window)."""
    _checks.ints("dilated_window_mask", n=n, window=window, minimum=0)
    _checks.ints("dilated_window_mask", dilation=dilation)
    off = _offsets(n)
    return sliding_window_mask(n, window * dilation, causal=causal) & (off % dilation == 0)


def strided_mask(n: int, stride: int, *, causal: bool = True) -> torch.Tensor:
    """Sparse Transformer's strided pattern: the previous ``stride`` keys, plus every stride-th key.

    With stride ≈ √n each row has about 2√n keys, and any key is reachable in two layers.
    Child et al.'s local part A(1) = {t, …, i}, t = max(0, i − l), with l the stride, holds
    l + 1 positions; this keeps exactly s = l (offsets 0 … s − 1). The paper splits A(1) and A(2) across heads or
    layers; this mask is their union.
    """
    _checks.ints("strided_mask", n=n, minimum=0)
    _checks.ints("strided_mask", stride=stride)
    off = _offsets(n)
    mask = (off.abs() < stride) | (off % stride == 0)
    return mask & (off >= 0) if causal else mask


def global_mask(n: int, global_tokens) -> torch.Tensor:
    """Global tokens attend to every key and every query attends to them (Longformer)."""
    _checks.ints("global_mask", n=n, minimum=0)
    mask = torch.zeros(n, n, dtype=torch.bool)
    idx = torch.as_tensor(list(global_tokens), dtype=torch.long)
    if idx.numel() and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"global_tokens must lie in [0, {n}), got {idx.tolist()}")
    mask[idx, :] = True
    mask[:, idx] = True
    return mask


def longformer_mask(n: int, window: int, global_tokens=(0,), *, causal: bool = False) -> torch.Tensor:
    """Sliding window plus global tokens; causal keeps only j <= i."""
    mask = sliding_window_mask(n, window) | global_mask(n, global_tokens)
    return mask & (_offsets(n) >= 0) if causal else mask


def bigbird_mask(n: int, window: int, n_global: int, n_random: int, *, seed: int = 0,
                 causal: bool = False) -> torch.Tensor:
    """BigBird: a window, the first ``n_global`` tokens as global, and ``n_random`` random keys per row."""
    _checks.ints("bigbird_mask", n_global=n_global, n_random=n_random, minimum=0)
    mask = sliding_window_mask(n, window) | global_mask(n, range(n_global))
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(n, n, generator=g).masked_fill(mask, -1.0)      # pick among keys not yet allowed
    if causal:
        scores = scores.masked_fill(_offsets(n) < 0, -1.0)
    picks = scores.topk(min(n_random, n), dim=-1)
    mask = mask.scatter(-1, picks.indices, picks.values > 0) | mask
    return mask & (_offsets(n) >= 0) if causal else mask


def block_sparse_mask(n: int, block: int, layout: torch.Tensor) -> torch.Tensor:
    """Expand a (⌈n/block⌉, ⌈n/block⌉) boolean block layout to an (n, n) mask."""
    _checks.ints("block_sparse_mask", n=n, minimum=0)
    _checks.ints("block_sparse_mask", block=block)
    blocks = math.ceil(n / block)
    if layout.shape != (blocks, blocks):
        raise ValueError(f"layout must have shape ({blocks}, {blocks}) for n={n}, block={block}; got {tuple(layout.shape)}")
    return layout.bool().repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :n]


def keys_per_row(mask: torch.Tensor) -> torch.Tensor:
    """Number of keys each query may attend to, (n,)."""
    _check_mask("keys_per_row", mask)
    return mask.sum(-1)


def density(mask: torch.Tensor) -> float:
    """Fraction of the n x n pairs allowed."""
    _check_mask("density", mask)
    return mask.float().mean().item()


def reach(mask: torch.Tensor, layers: int) -> list[torch.Tensor]:
    """Which keys each query can draw information from after 1, ..., ``layers`` stacked layers.

    Information flows along allowed edges; after L layers query i sees j when a path of at most
    L edges leads from j to i (the boolean L-th power of the mask, with self-loops). Returns
    ``layers`` boolean (n, n) matrices.
    """
    _check_mask("reach", mask)
    _checks.ints("reach", layers=layers)
    step = (mask | torch.eye(mask.shape[0], dtype=torch.bool)).float()
    current, out = torch.eye(mask.shape[0]), []
    for _ in range(layers):
        current = ((current @ step) > 0).float()
        out.append(current.bool())
    return out


def receptive_field(mask: torch.Tensor, layers: int) -> torch.Tensor:
    """Fraction of (query, key) pairs connected after 1, ..., ``layers`` layers, (layers,)."""
    return torch.tensor([r.float().mean().item() for r in reach(mask, layers)])


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, *,
                             causal: bool = False, scale: float | None = None, block: int | None = None) -> torch.Tensor:
    r"""Attention restricted to a window, in O(n·w) time and memory: no n x n matrix.

    .. math:: o_i = \sum_{j \in W(i)} \mathrm{softmax}_j(q_i \cdot k_j / \sqrt d)\, v_j,
              \quad W(i) = \{j : |i - j| \le w\} \text{ (causal: } i - w \le j \le i)

    Queries are taken ``block`` at a time (default max(w, 64)); a block of B queries needs only
    the keys from its first query minus w to its last plus w, so each step forms a
    (B, B + 2w) score tile and the whole pass O(n (B + 2w)) scores, never n x n.

    Args: q, k: (b, h, n, d); v: (b, h, n, d_v) (self-attention: n = m, same heads).
    Returns: (b, h, n, d_v).
    """
    _check_shapes(q, k, v, "sliding_window_attention")
    if q.dim() != 4 or k.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"sliding_window_attention: needs q and k of the same shape (b, h, n, d), "
                         f"got {tuple(q.shape)} and {tuple(k.shape)}")
    _checks.ints("sliding_window_attention", window=window, minimum=0)
    block = max(window, 64) if block is None else block
    _checks.ints("sliding_window_attention", block=block)
    n = q.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    for q0 in range(0, n, block):
        q1 = min(q0 + block, n)
        k0, k1 = max(q0 - window, 0), q1 if causal else min(q1 + window, n)
        scores = q[..., q0:q1, :] @ k[..., k0:k1, :].transpose(-2, -1) * scale
        offset = torch.arange(q0, q1, device=q.device).unsqueeze(-1) - torch.arange(k0, k1, device=q.device)
        weights = torch.softmax(scores.masked_fill(~_in_window(offset, window, causal), float("-inf")), dim=-1)
        out[..., q0:q1, :] = weights @ v[..., k0:k1, :]
    return out


def tile_classes(mask: torch.Tensor, block: int) -> torch.Tensor:
    """Classify the (block × block) tiles of a mask: 0 empty, 1 partial, 2 full.

    A GPU kernel computes a tile of the score matrix whole or skips it whole, so what a sparse
    pattern saves is its empty tiles; a full tile needs no mask, a partial one is computed whole
    and masked inside (FlexAttention's block mask keeps exactly these three classes). Tiles at
    the bottom and right edge are cut to the matrix (n need not be a multiple of ``block``).

    Args: mask: (n, n) boolean, True = may attend; block: tile side B.
    Returns: (⌈n/B⌉, ⌈n/B⌉) int8 tensor.
    """
    _check_mask("tile_classes", mask)
    _checks.ints("tile_classes", block=block)
    n = mask.shape[0]
    t = math.ceil(n / block)
    padded = torch.zeros(t * block, t * block, dtype=torch.int32)
    inside = torch.zeros_like(padded)
    padded[:n, :n] = mask.int()
    inside[:n, :n] = 1
    allowed = padded.view(t, block, t, block).sum((1, 3))     # allowed pairs per tile
    cells = inside.view(t, block, t, block).sum((1, 3))       # pairs per tile (>= 1)
    kinds = (allowed > 0).to(torch.int8)
    kinds[allowed == cells] = 2
    return kinds


def window_tiles(n: int, block: int, window: int, *, causal: bool = False) -> int:
    """Tiles of side B that the blocked window kernel computes: Σ over query blocks of the key
    blocks that overlap its key range [q0 − w, q1 − 1 + w] (causal: [q0 − w, q1 − 1]).

    Equals the number of non-empty (B × B) tiles of ``sliding_window_mask(n, window)``
    (tests/test_sparse.py checks it); dense attention computes ⌈n/B⌉² tiles, causal dense
    ⌈n/B⌉(⌈n/B⌉ + 1)/2.
    """
    _checks.ints("window_tiles", n=n, block=block)
    _checks.ints("window_tiles", window=window, minimum=0)
    total = 0
    for q0 in range(0, n, block):
        q1 = min(q0 + block, n)
        first = max(q0 - window, 0) // block
        last = (q1 - 1 if causal else min(q1 - 1 + window, n - 1)) // block
        total += last - first + 1
    return total
