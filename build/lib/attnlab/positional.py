"""Positional encodings: how a permutation-equivariant attention layer learns about order.

Read alongside: Vaswani et al. 2017, section 3.5 (sinusoidal). Chapter 02 adds learned
embeddings, RoPE (Su et al. 2021) and ALiBi (Press et al. 2022).

Shapes: n positions, d model width; encodings are (n, d) and are added to (b, n, d) inputs.
"""
from __future__ import annotations

import torch


def sinusoidal_encoding(n: int, d: int, base: float = 10000.0) -> torch.Tensor:
    r"""The sinusoidal position table of the Transformer, (n, d).

    .. math:: PE_{p, 2i} = \sin(p\,\omega_i), \quad PE_{p, 2i+1} = \cos(p\,\omega_i),
              \quad \omega_i = \mathrm{base}^{-2i/d}

    The frequencies form a geometric progression, wavelengths from 2π to base·2π. For odd
    d the last column is a sine with no cosine partner.
    """
    if n < 0 or d < 1:
        raise ValueError(f"sinusoidal_encoding needs n >= 0 and d >= 1, got n={n}, d={d}")
    position = torch.arange(n, dtype=torch.float64).unsqueeze(-1)
    omega = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = position * omega
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d // 2])
    return pe.to(torch.get_default_dtype())
