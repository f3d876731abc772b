"""Native sparse attention (NSA), simplified: compressed, selected and sliding-window branches.

Read alongside: Yuan et al. 2025, "Native Sparse Attention: Hardware-Aligned and Natively
Trainable Sparse Attention" (arXiv:2502.11089), section 3: token compression, token
selection with blockwise importance shared across a GQA group, the sliding window, and the
gated sum of the three branches.

Each query attends through three branches and mixes them with per-query, per-head gates:

* **compressed**: keys and values are pooled into one summary per block of ``block`` tokens; the
  query attends to the summaries of the blocks that are complete before it (coarse, global);
* **selected**: the compressed branch's attention probabilities score the blocks; the top
  ``n_selected`` blocks (the query's own block always among them) are attended token by token
  (fine, where it matters). Heads that share a key/value head (a GQA group) share the choice,
  so a kernel loads each selected block once for the whole group;
* **window**: the last ``window`` tokens (local).

Simplifications, said once: the paper compresses with a learned MLP over overlapping blocks
(length 32, stride 16) and selects with larger blocks (64) derived from the compressed scores;
here a block is pooled by its mean, compression and selection blocks coincide, and the three
branches share one set of keys and values (the paper gives each branch its own). This module
computes the branches with dense masks, O(n²), to show *what* NSA attends to; the paper's speed
comes from a Triton kernel that touches only the selected blocks.

Shapes (see the package docstring): q (b, h, n, d); k, v (b, h_kv, n, d); gates (b, h, n, 3) in
the order (compressed, selected, window); n_blocks = ⌈n / block⌉.
"""
from __future__ import annotations

import math

import torch

from . import _checks
from .attention import _check_shapes, masked_scores, masked_softmax, repeat_kv
from .sparse import sliding_window_mask

BRANCHES = ("compressed", "selected", "window")


def compress(x: torch.Tensor, block: int) -> torch.Tensor:
    r"""Mean of each complete block of ``block`` rows: (..., n, d) -> (..., ⌊n / block⌋, d).

    .. math:: \tilde k_j = \frac1l \sum_{t = jl}^{(j+1)l - 1} k_t
    """
    _checks.ints("compress", block=block)
    if x.dim() < 2:
        raise ValueError(f"compress: x must have shape (..., n, d), got {tuple(x.shape)}")
    n_full = x.shape[-2] // block
    return x[..., : n_full * block, :].unflatten(-2, (n_full, block)).mean(-2)


def _attend(q, k, v, mask, scale):
    return masked_softmax(masked_scores(q @ k.transpose(-2, -1) * scale, mask)) @ v


def selection_mask(importance: torch.Tensor, n: int, block: int, n_selected: int) -> torch.Tensor:
    r"""Token mask of the selected blocks, (b, h_kv, n, n), True = query i attends to key j.

    Query i may select any block that starts at or before i; its own block is always selected,
    then the most important others until ``n_selected`` blocks:

    .. math:: \mathcal I_i = \{\lfloor i/l \rfloor\} \cup \mathrm{top}_{n-1}\{\, j < \lfloor i/l \rfloor : p_{ij} \,\},
              \qquad \text{mask}_{it} = [\lfloor t/l \rfloor \in \mathcal I_i] \wedge [t \le i]

    Args: importance (b, h_kv, n, n_blocks), larger = more important; n the sequence length.
    """
    _checks.ints("selection_mask", n=n, minimum=0)
    _checks.ints("selection_mask", block=block, n_selected=n_selected)
    if importance.dim() < 2 or importance.shape[-2] != n or importance.shape[-1] != math.ceil(n / block):
        raise ValueError(f"selection_mask: importance must be (..., n, ⌈n / block⌉) = (..., {n}, "
                         f"{math.ceil(n / block)}), got {tuple(importance.shape)}")
    n_blocks = importance.shape[-1]
    own = torch.arange(n, device=importance.device) // block                         # (n,)
    blocks = torch.arange(n_blocks, device=importance.device)
    score = importance.masked_fill(blocks > own.unsqueeze(-1), float("-inf"))     # future blocks never
    score = score.masked_fill(blocks == own.unsqueeze(-1), float("inf"))           # own block always
    top = score.topk(min(n_selected, n_blocks), dim=-1)
    chosen = torch.zeros_like(score, dtype=torch.bool).scatter(-1, top.indices, ~torch.isneginf(top.values))
    token_block = torch.arange(n, device=importance.device) // block
    causal = torch.arange(n, device=importance.device) <= torch.arange(n, device=importance.device).unsqueeze(-1)
    return chosen[..., token_block] & causal


def native_sparse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: torch.Tensor, *,
    block: int = 16, n_selected: int = 4, window: int = 32, scale: float | None = None,
    return_branches: bool = False,
):
    r"""Causal NSA: a gated sum of compressed, selected and sliding-window attention.


    .. math:: o_i = g^{cmp}_i\,\mathrm{Attn}(q_i, \tilde K_{<i}, \tilde V_{<i})
                  + g^{slc}_i\,\mathrm{Attn}(q_i, K_{\mathcal S(i)}, V_{\mathcal S(i)})
                  + g^{win}_i\,\mathrm{Attn}(q_i, K_{[i-w,\,i]}, V_{[i-w,\,i]})

    with :math:`\tilde K_{<i}` the summaries of blocks that end at or before i, and
    :math:`\mathcal S(i)` the tokens of the selected blocks up to i
    (:func:`selection_mask`), scored by the compressed probabilities summed over the
    heads of each GQA group.

    Args:
        q: (b, h, n, d); k: (b, h_kv, n, d); v: (b, h_kv, n, d_v); h_kv divides h.
        gates: (b, h, n, 3), the weights of the three branches (the paper uses a sigmoid
            of a linear map of the input).
        block: tokens per compression / selection block; n_selected: blocks per query;
        window: a query sees keys i - window .. i in the window branch.
        return_branches: also return a dict with each branch's output (b, h, n, d_v) and
            the selection mask (b, h_kv, n, n).
    Returns: (b, h, n, d_v) [, dict].
    """
    _check_shapes(q, k, v, "native_sparse_attention")
    if q.dim() != 4 or k.shape[-2] != q.shape[-2]:
        raise ValueError(f"native_sparse_attention needs q (b, h, n, d) and "
                         f"k (b, h_kv, n, d), "
                         f"got {tuple(q.shape)} and {tuple(k.shape)}")
    if gates.shape != q.shape[:-1] + (3,):
        raise ValueError(f"gates must have shape {tuple(q.shape[:-1]) + (3,)} "
                         f"(b, h, n, 3), got {tuple(gates.shape)}")
    if block < 1 or n_selected < 1 or window < 0:
        raise ValueError(f"block and n_selected must be >= 1 and window >= 0, "
                         f"got {block}, {n_selected}, {window}")
    b, h, n, _ = q.shape
    h_kv = k.shape[1]
    group = h // h_kv
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k_full, v_full = repeat_kv(k, group), repeat_kv(v, group)

    # compressed branch: block j is visible once complete, (j + 1) l - 1 <= i
    k_cmp = repeat_kv(compress(k, block), group)
    v_cmp = repeat_kv(compress(v, block), group)
    ends = (torch.arange(k_cmp.shape[-2], device=q.device) + 1) * block - 1
    visible = ends <= torch.arange(n, device=q.device).unsqueeze(-1)       # (n, n_cmp)
    p_cmp = masked_softmax(masked_scores(q @ k_cmp.transpose(-2, -1) * scale, visible))
    out_cmp = p_cmp @ v_cmp

    # selected branch: importance per block, summed over the heads of a GQA group
    n_blocks = math.ceil(n / block)
    # the last, incomplete block scores 0
    importance = torch.nn.functional.pad(p_cmp, (0, n_blocks - p_cmp.shape[-1]))
    importance = importance.unflatten(1, (h_kv, group)).sum(2)  # (b, h_kv, n, n_blocks)
    selected = selection_mask(importance, n, block, n_selected)
    out_slc = _attend(q, k_full, v_full, repeat_kv(selected, group), scale)

    # window branch
    in_window = sliding_window_mask(n, window, causal=True).to(q.device)
    out_win = _attend(q, k_full, v_full, in_window, scale)

    gates = gates.unsqueeze(-1)
    out = (gates[..., 0, :] * out_cmp + gates[..., 1, :] * out_slc
           + gates[..., 2, :] * out_win)
    if not return_branches:
        return out
    return out, {"compressed": out_cmp, "selected": out_slc, "window": out_win,
                 "selection_mask": selected}


def keys_attended(n: int, *, block: int, n_selected: int, window: int, compress_block: int | None = None,
                  compress_stride: int | None = None) -> dict[str, int]:
    r"""Keys one late query touches in each branch (the paper's cost argument, Yuan et al. 2025, §3.3 and Table 4).

    compressed :math:`\lfloor (n - l_c)/s \rfloor + 1` summaries of blocks of :math:`l_c` tokens
    taken every :math:`s` tokens (default :math:`l_c = s =` ``block``, non-overlapping), selected
    :math:`n_{sel}\,l`, window :math:`w + 1`; their sum grows like n / s, against n for full attention.
    """
    compress_block = block if compress_block is None else compress_block
    compress_stride = compress_block if compress_stride is None else compress_stride
    _checks.ints("keys_attended", n=n, n_selected=n_selected, window=window, minimum=0)
    _checks.ints("keys_attended", block=block, compress_block=compress_block, compress_stride=compress_stride)
    compressed = (n - compress_block) // compress_stride + 1 if n >= compress_block else 0
    return {"compressed": compressed, "selected": n_selected * block, "window": window + 1, "full": n}
