"""Quantised attention in the spirit of SageAttention: low-bit Q Kᵀ, made accurate by smoothing K.

Read alongside: Zhang et al. 2024, "SageAttention: Accurate 8-bit Attention for Plug-and-play
Inference Acceleration" (INT8 Q Kᵀ with per-block scales, and K smoothing); Zhang et al.
2025, "SageAttention3: Microscaling FP4 Attention for Inference and an Exploration of 8-bit
Training" (FP4 microscaling with one scale per 16 numbers, on Blackwell GPUs).

Keys in trained models share a large common component (a mean over tokens that dwarfs the
variation between tokens). A per-block scale must then cover that mean, and the small part
that actually decides the softmax gets few quantisation levels. Subtracting the mean over
tokens, k_j - k̄, changes every score of a query row by the same q·k̄, which the softmax
ignores: the result is exact in real arithmetic and far better after quantisation.

This module simulates the arithmetic (integer products summed exactly in float64, scales
applied after), to measure the error; it makes nothing faster. P and V stay in the input
precision (SageAttention keeps them in FP16; SageAttention3 quantises them to FP4 too).

Shapes: q (b, h, n, d), k (b, h, m, d), v (b, h, m, d_v).
"""
from __future__ import annotations

import math

import torch

from . import _checks
from .attention import _check_shapes, masked_scores, masked_softmax, repeat_kv

INT8_MAX = 127
FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # the non-negative values of the 4-bit E2M1 format


def quantize_int8(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Symmetric INT8 with one scale per block of ``block`` rows (tokens).

    .. math:: \delta_B = \frac{\max_{t \in B,\,i} |x_{ti}|}{127}, \qquad
              \hat x_{ti} = \mathrm{round}(x_{ti} / \delta_B) \in \{-127, \dots, 127\}

    Args: x (..., n, d); block >= 1.
    Returns: (integers as int8 (..., n, d), scales (..., n, 1), each row's block scale repeated).
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    n = x.shape[-2]
    pad = (-n) % block
    rows = torch.nn.functional.pad(x.abs(), (0, 0, 0, pad)).unflatten(-2, (-1, block))     # (..., n/B, B, d)
    peak = rows.amax(dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    scale = (peak / INT8_MAX).expand(*rows.shape[:-1], 1).flatten(-3, -2)[..., :n, :]
    ints = torch.round(x / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return ints, scale


def fake_fp4(x: torch.Tensor, group: int = 16) -> torch.Tensor:
    r"""Round to FP4 (E2M1) with one scale per ``group`` consecutive numbers of the last axis.

    .. math:: s_G = \frac{\max_{i \in G}|x_i|}{6}, \qquad
              \hat x_i = s_G \cdot \arg\min_{e \in \pm\{0, 0.5, 1, 1.5, 2, 3, 4, 6\}} |x_i / s_G - e|

    This is the microscaling of SageAttention3 (NVFP4 stores s_G in FP8; here it stays exact).
    Args: x (..., d) with d divisible by ``group``. Returns: the dequantised values, x's shape.
    """
    _checks.ints("fake_fp4", group=group)
    if x.shape[-1] % group:
        raise ValueError(f"the last axis of x ({x.shape[-1]}) must be divisible by group={group}")
    groups = x.unflatten(-1, (-1, group))
    scale = (groups.abs().amax(-1, keepdim=True) / FP4_E2M1[-1]).clamp_min(torch.finfo(x.dtype).tiny)
    levels = torch.tensor(FP4_E2M1, dtype=x.dtype, device=x.device)
    scaled = groups / scale
    nearest = levels[(scaled.abs().unsqueeze(-1) - levels).abs().argmin(-1)]
    return (torch.sign(scaled) * nearest * scale).flatten(-2)


def smooth_keys(k: torch.Tensor) -> torch.Tensor:
    r"""Subtract the mean key over tokens: :math:`k_j - \bar k`, with :math:`\bar k = \frac1m\sum_j k_j`.

    Every score of a query row moves by the same :math:`q\cdot\bar k`, so the softmax, and the
    attention output, are unchanged. k: (..., m, d) -> (..., m, d).
    """
    if k.dim() < 2:
        raise ValueError(f"smooth_keys: k must have shape (..., m, d), got {tuple(k.shape)}")
    return k - k.mean(dim=-2, keepdim=True)


def quantized_scores(q: torch.Tensor, k: torch.Tensor, *, fmt: str = "int8", block: int = 32) -> torch.Tensor:
    r"""The score matrix :math:`QK^\top` computed from quantised Q and K.

    ``fmt="int8"``: per-block INT8 (:func:`quantize_int8`); the integer products are summed
    exactly and then multiplied by the two scales, :math:`\delta_Q \delta_K\,\hat Q \hat K^\top`.
    ``fmt="fp4"``: :func:`fake_fp4` on both, groups of 16 along d.
    Args: q (..., n, d), k (..., m, d). Returns: (..., n, m) in q's dtype.
    """
    if fmt == "int8":
        q_int, q_scale = quantize_int8(q, block)
        k_int, k_scale = quantize_int8(k, block)
        exact_sum = q_int.double() @ k_int.double().transpose(-2, -1)          # what an int32 accumulator holds
        return (exact_sum * q_scale.double() * k_scale.double().transpose(-2, -1)).to(q.dtype)
    if fmt == "fp4":
        return fake_fp4(q) @ fake_fp4(k).transpose(-2, -1)
    raise ValueError(f"fmt must be 'int8' or 'fp4', got {fmt!r}")


def quantized_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, smooth_k: bool = True,
    fmt: str = "int8", block: int = 32, causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    r"""Attention whose scores come from quantised Q and (optionally smoothed) K.

    .. math:: O = \mathrm{softmax}\big(c\,\mathrm{Deq}(\mathrm{Quant}(Q)\,
              \mathrm{Quant}(K - \bar k)^\top)\big)\,V

    Args:
        q: (b, h, n, d); k: (b, h_kv, m, d); v: (b, h_kv, m, d_v).
        smooth_k: subtract the mean key first (:func:`smooth_keys`).
        fmt, block: see :func:`quantized_scores`.
        causal: bottom-right aligned causal mask; scale: default 1 / sqrt(d).
    Returns: (b, h, n, d_v).
    """
    _check_shapes(q, k, v, "quantized_attention")
    n_rep = q.shape[-3] // k.shape[-3]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    if smooth_k:
        k = smooth_keys(k)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = quantized_scores(q, k, fmt=fmt, block=block) * scale
    return masked_softmax(masked_scores(scores, causal=causal)) @ v
