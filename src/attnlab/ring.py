"""Ring attention, simulated on one machine: P virtual devices pass key/value blocks around a ring.

Read alongside: Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context" (the algorithm, and when communication hides behind compute);
Liu & Abbeel 2023, "Blockwise Parallel Transformer"; Dao et al. 2022, "FlashAttention" (the
online softmax that makes the merge exact).

The sequence is cut into P contiguous blocks (``torch.tensor_split``, so any length works).
Device i keeps its query block Q_i for the whole computation and starts with its own K_i, V_i.
At step t it holds the key/value block of device (i - t) mod P, runs local FlashAttention on it
(:func:`attnlab.flash` tiles, which also return each row's log-sum-exp), merges the partial
result into its running output, then sends the block to device i + 1. After P steps every
device has seen every block, and its output is exact attention for its queries. On real
hardware the send overlaps the next block's compute; here the ring is a Python loop.

Shapes (see the package docstring): q (b, h, n, d), k and v (b, h, n, d) (self-attention, so
m = n); P the number of devices; a block holds about n / P positions.
"""
from __future__ import annotations

import math

import torch

from . import _checks
from .attention import _check_shapes, repeat_kv
from .flash import DEFAULT_BLOCK, flash_forward


def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Merge two attention results over disjoint key sets into the result over their union.

    Each part is normalised over its own keys and carries its log-sum-exp
    :math:`\ell = \log\sum_j e^{s_j}` (a row that saw no key has :math:`\ell = \log 0 = -\infty`, the
    merge's identity, as in chapter 7; +inf is accepted as the same mark):

    .. math:: \ell = \log(e^{\ell_a} + e^{\ell_b}), \qquad
              O = e^{\ell_a - \ell}\,O_a + e^{\ell_b - \ell}\,O_b

    This is FlashAttention's rescaling step applied to whole blocks.

    Args: out_a, out_b (..., n, d_v); lse_a, lse_b (..., n).
    Returns: (merged output (..., n, d_v), merged log-sum-exp (..., n)).
    """
    for name, out, lse in (("a", out_a, lse_a), ("b", out_b, lse_b)):
        if out.shape != out_a.shape or lse.shape != out_a.shape[:-1]:
            raise ValueError(f"merge_partials: out_{name} must be {tuple(out_a.shape)} (..., n, d_v) and lse_{name} "
                             f"{tuple(out_a.shape[:-1])} (..., n), got {tuple(out.shape)} and {tuple(lse.shape)}")
    empty_a, empty_b = torch.isinf(lse_a), torch.isinf(lse_b)
    a = torch.where(empty_a, torch.full_like(lse_a, float("-inf")), lse_a)
    b = torch.where(empty_b, torch.full_like(lse_b, float("-inf")), lse_b)
    lse = torch.logaddexp(a, b)
    both_empty = empty_a & empty_b
    safe = torch.where(both_empty, torch.zeros_like(lse), lse)
    weight_a = torch.exp(a - safe).unsqueeze(-1)
    weight_b = torch.exp(b - safe).unsqueeze(-1)
    out = weight_a * out_a + weight_b * out_b
    return out, torch.where(both_empty, torch.full_like(lse, float("-inf")), lse)


def ring_schedule(n_devices: int) -> list[list[int]]:
    """Which key/value block each device holds at each step: ``schedule[t][i] = (i - t) mod P``."""
    if n_devices < 1:
        raise ValueError(f"n_devices must be >= 1, got {n_devices}")
    return [[(i - t) % n_devices for i in range(n_devices)] for t in range(n_devices)]


def ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_devices: int, *,
    causal: bool = False, scale: float | None = None, block: int | None = None,
) -> torch.Tensor:
    r"""Exact self-attention computed as P virtual devices on a ring would.

    .. math:: O_i = \mathrm{softmax}\big(Q_i [K_0; \dots; K_{P-1}]^\top c\big)
              \,[V_0; \dots; V_{P-1}],

    accumulated one block :math:`(K_j, V_j)` per step with ``merge_partials``.

    With ``causal``, a device skips the blocks that lie entirely after its queries
    (j > i) and applies the causal mask inside its own block (j = i); blocks j < i are
    fully visible. The skipped steps are the load imbalance that striped ring attention
    (Brandon et al. 2023) fixes.

    Args:
        q: (b, h, n, d); k: (b, h_kv, n, d); v: (b, h_kv, n, d_v) (self-attention:
            one n; h_kv divides h).
        n_devices: P >= 1; n need not be divisible by P (block sizes differ by <= 1).
        causal: causal mask over global positions.
        scale: multiplies the scores; default 1 / sqrt(d).
        block: tile size of each device's local FlashAttention (default that of
            :mod:`attnlab.flash`).
    Returns: (b, h, n, d_v).
    """
    _check_shapes(q, k, v, "ring_attention")
    if q.dim() != 4 or k.shape[-2] != q.shape[-2]:
        raise ValueError(f"ring_attention: needs q (b, h, n, d) and "
                         f"k, v (b, h_kv, n, d) with the same n, "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if not isinstance(n_devices, int) or n_devices < 1:
        raise ValueError(f"n_devices must be a positive int, got {n_devices!r}")
    group = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, group), repeat_kv(v, group)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    block = DEFAULT_BLOCK if block is None else block
    _checks.ints("ring_attention", block=block)
    q_blocks = torch.tensor_split(q, n_devices, dim=-2)
    kv_blocks = list(zip(torch.tensor_split(k, n_devices, dim=-2),
                         torch.tensor_split(v, n_devices, dim=-2)))
    outputs = []
    for device, q_i in enumerate(q_blocks):
        out = q_i.new_zeros(*q_i.shape[:-1], v.shape[-1])
        lse = q_i.new_full(q_i.shape[:-1], float("-inf"))      # log 0: no key seen yet
        for step in range(n_devices):
            j = (device - step) % n_devices   # the block this device holds at this step
            if causal and j > device:
                continue                       # entirely in the future: nothing to add
            k_j, v_j = kv_blocks[j]
            if q_i.shape[-2] == 0 or k_j.shape[-2] == 0:
                continue
            part, part_lse = flash_forward(q_i, k_j, v_j, causal=causal and j == device,
                                           block_q=block, block_k=block, scale=scale)
            out, lse = merge_partials(out, lse, part, part_lse)
        outputs.append(out)
    return torch.cat(outputs, dim=-2)


def ring_costs(n: int, d: int, n_devices: int, *, n_heads: int = 1, bytes_per_element: int = 2) -> dict[str, float]:
    r"""Per-device memory and communication of one ring-attention layer (forward), in bytes.

    With :math:`c = \lceil n/P \rceil` positions per device and d features per head:

    * activation memory per device: its Q block, the K/V block it computes on, the K/V block
      arriving from its neighbour, and its output: :math:`(c + 2c + 2c + c)\,h\,d`;
      independent of n for a fixed c, so the context grows with the number of devices;
    * bytes each device sends: P - 1 key/value blocks, :math:`(P-1)\,2c\,h\,d`;
    * bytes the whole ring sends: P times that, about :math:`2nhd(P-1)`;
    * full attention on one device would hold Q, K, V, O: :math:`4nhd`.

    The ring hides communication when a block's compute, about :math:`4c^2 h d` FLOPs, takes
    longer than sending its :math:`2chd` elements (Liu et al. 2023 derive c ≥ FLOPS / bandwidth).
    """
    if min(n, d, n_devices, n_heads, bytes_per_element) < 1:
        raise ValueError(f"n, d, n_devices, n_heads and bytes_per_element must be positive, "
                         f"got {n}, {d}, {n_devices}, {n_heads}, {bytes_per_element}")
    chunk = math.ceil(n / n_devices)
    per = n_heads * d * bytes_per_element
    return {
        "block length": chunk,
        "memory per device": 6 * chunk * per,
        "sent per device": (n_devices - 1) * 2 * chunk * per,
        "sent in total": n_devices * (n_devices - 1) * 2 * chunk * per,
        "single-device memory": 4 * n * per,
        "compute per block (FLOPs)": 4 * chunk * chunk * n_heads * d,
    }
