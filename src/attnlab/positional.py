"""Positional encodings: how a permutation-equivariant attention layer learns about order.

Read alongside: Vaswani et al. 2017, section 3.5 (sinusoidal); Su et al. 2021, "RoFormer"
(RoPE); Press et al. 2022, "Train Short, Test Long" (ALiBi).

Shapes: n positions, d model (or head) width; absolute encodings are (n, d) and are added
to (b, n, d) inputs; RoPE rotates queries and keys (..., n, d); ALiBi biases are (h, n, n)
and are added to attention scores.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from . import _checks


def frequencies(d: int, base: float = 10000.0) -> torch.Tensor:
    r"""The d // 2 angular frequencies :math:`\omega_i = \mathrm{base}^{-2i/d}`, float64.

    A geometric progression from 1 down to nearly 1/base: wavelengths 2π to base · 2π.
    """
    _checks.ints("frequencies", d=d)
    return base ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2 / d)


def sinusoidal_encoding(n: int, d: int, base: float = 10000.0, dtype: torch.dtype | None = None) -> torch.Tensor:
    r"""The sinusoidal position table of the Transformer, (n, d).

    .. math:: PE_{p, 2i} = \sin(p\,\omega_i), \quad PE_{p, 2i+1} = \cos(p\,\omega_i),
              \quad \omega_i = \mathrm{base}^{-2i/d}

    Dimensions 2i and 2i+1 share a frequency. For odd d the last column is a sine with no
    cosine partner, at frequency base^(-(d-1)/d). Computed in float64, returned in ``dtype``
    (default: torch's default dtype).
    """
    if n < 0 or d < 1:
        raise ValueError(f"sinusoidal_encoding needs n >= 0 and d >= 1, got n={n}, d={d}")
    position = torch.arange(n, dtype=torch.float64).unsqueeze(-1)
    omega = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = position * omega
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d // 2])
    return pe.to(dtype or torch.get_default_dtype())


def shift_matrix(k: float, d: int, base: float = 10000.0) -> torch.Tensor:
    r"""The (d, d) matrix M_k with PE_{p+k} = M_k PE_p for every position p (float64).

    Block diagonal: for each frequency ω_i the 2 x 2 rotation
    :math:`\begin{pmatrix}\cos k\omega_i & \sin k\omega_i\\ -\sin k\omega_i & \cos k\omega_i\end{pmatrix}`
    acting on (sin pω_i, cos pω_i). The map is linear (no offset) and does not depend on p.
    Needs even d: an unpaired sine cannot be shifted without its cosine.
    """
    if d % 2:
        raise ValueError(f"shift_matrix needs an even d (sine/cosine pairs), got d={d}")
    m = torch.zeros(d, d, dtype=torch.float64)
    angle = k * frequencies(d, base)
    c, s = torch.cos(angle), torch.sin(angle)
    idx = torch.arange(0, d, 2)
    m[idx, idx], m[idx, idx + 1] = c, s
    m[idx + 1, idx], m[idx + 1, idx + 1] = -s, c
    return m


class LearnedPositionalEmbedding(nn.Module):
    """One trainable vector per position, added to the input (BERT, GPT-1/2/3).

    It has nothing to say about positions beyond ``max_len``: a longer input is an error.
    """

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(b, n, d_model) -> (b, n, d_model), adding the embeddings of positions 0..n-1."""
        n = x.shape[-2]
        if n > self.max_len:
            raise ValueError(
                f"x has {n} positions but the embedding was trained for max_len={self.max_len}; "
                f"a learned table cannot extrapolate"
            )
        return x + self.weight[:n]


def _rope_angles(n: int, d: int, positions, base: float, device) -> torch.Tensor:
    if positions is None:
        positions = torch.arange(n, device=device)
    positions = torch.as_tensor(positions, device=device, dtype=torch.float64)
    if positions.shape[-1] != n:
        raise ValueError(f"positions must have one entry per row of x ({n}), got shape {tuple(positions.shape)}")
    return positions.unsqueeze(-1) * frequencies(d, base).to(device)  # (..., n, d/2)


def _check_rope(fn: str, x: torch.Tensor) -> None:
    _checks.floats(fn, x=x)
    if x.dim() < 2 or x.shape[-1] % 2:
        raise ValueError(f"{fn}: x must have shape (..., n, d) with d even, got {tuple(x.shape)}")


def apply_rope(x: torch.Tensor, positions=None, base: float = 10000.0) -> torch.Tensor:
    r"""Rotary position embedding: rotate each pair (x_{2j}, x_{2j+1}) by the angle p θ_j.

    .. math:: \begin{pmatrix} x'_{2j} \\ x'_{2j+1} \end{pmatrix} =
              \begin{pmatrix}\cos p\theta_j & -\sin p\theta_j\\ \sin p\theta_j & \cos p\theta_j\end{pmatrix}
              \begin{pmatrix} x_{2j} \\ x_{2j+1} \end{pmatrix}, \quad \theta_j = \mathrm{base}^{-2j/d}

    In complex form, z_j = x_{2j} + i x_{2j+1} becomes z_j e^{i p θ_j}, so the score between a
    query at m and a key at n is :math:`\mathrm{Re}\sum_j q_j \overline{k_j} e^{i(m-n)\theta_j}`:
    a function of m - n only. Pairs are adjacent (RoFormer's layout; some codebases pair
    dimension j with j + d/2 instead, which is the same up to a permutation of dimensions).

    Args:
        x: (..., n, d) queries or keys, d even.
        positions: (n,) or broadcastable (..., n) positions; default 0..n-1.
    Returns: (..., n, d), same dtype as x.
    """
    _check_rope("apply_rope", x)
    n, d = x.shape[-2:]
    angles = _rope_angles(n, d, positions, base, x.device)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def apply_rope_complex(x: torch.Tensor, positions=None, base: float = 10000.0) -> torch.Tensor:
    """The same rotation as :func:`apply_rope`, written as a complex multiplication (reference form)."""
    _check_rope("apply_rope_complex", x)
    n, d = x.shape[-2:]
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    angles = _rope_angles(n, d, positions, base, x.device)
    z = z * torch.polar(torch.ones_like(angles), angles)
    return torch.view_as_real(z).flatten(-2).to(x.dtype)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    r"""ALiBi's per-head slopes, (h,): the geometric sequence 2^{-8/h}, 2^{-16/h}, ..., 2^{-8}.

    For h not a power of two, the paper takes the slopes of the nearest smaller power of two
    and fills up with every other slope of the next power of two.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")

    def power_of_two(h: int) -> list[float]:
        return [2 ** (-8 * (i + 1) / h) for i in range(h)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_two(closest) + extra)


def alibi_bias(n_heads: int, n: int) -> torch.Tensor:
    r"""ALiBi's additive attention bias, (h, n, n): :math:`-s_h\,|i - j|` for query i, key j.

    Added to the scores instead of adding anything to the tokens; with a causal mask only
    j <= i is used, where the bias is :math:`s_h (j - i)`. Far keys are penalised linearly,
    with a different slope per head.
    """
    _checks.ints("alibi_bias", n=n, minimum=0)
    distance = (torch.arange(n).unsqueeze(-1) - torch.arange(n)).abs()
    return -alibi_slopes(n_heads).view(-1, 1, 1) * distance
