"""Neural scaling laws: Kaplan et al. 2020 and Chinchilla (Hoffmann et al. 2022).

The constants are the published ones, quoted; nothing here is fitted by the book.
N: parameters (Kaplan: non-embedding), D: training tokens, C ≈ 6 N D training FLOPs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from . import _checks


def kaplan_loss(n_params, n_c: float = 8.8e13, alpha: float = 0.076):
    r"""Kaplan et al.'s loss against non-embedding parameters (data not limiting): :math:`(N_c/N)^{\alpha_N}`."""
    smallest = torch.as_tensor(n_params).min().item()
    if not smallest > 0:
        raise ValueError(f"kaplan_loss: n_params must be positive (a parameter count), got {smallest}")
    return (n_c / n_params) ** alpha


@dataclass(frozen=True)
class ChinchillaFit:
    r"""The parametric loss :math:`L(N, D) = E + A N^{-\alpha} + B D^{-\beta}` of Hoffmann et al.'s approach 3."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def loss(self, n_params, n_tokens):
        return self.E + self.A * n_params ** -self.alpha + self.B * n_tokens ** -self.beta

    def compute_optimal(self, flops: float) -> tuple[float, float]:
        r"""Minimise L under C = 6 N D, in closed form.

        .. math:: N_{opt} = G\,(C/6)^{a}, \quad D_{opt} = G^{-1} (C/6)^{b}, \quad
                  a = \frac{\beta}{\alpha+\beta}, \; b = \frac{\alpha}{\alpha+\beta}, \;
                  G = \Big(\frac{\alpha A}{\beta B}\Big)^{1/(\alpha+\beta)}
        """
        _checks.at_least("ChinchillaFit.compute_optimal", 1, flops=flops)
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1 / (self.alpha + self.beta))
        a = self.beta / (self.alpha + self.beta)
        n_opt = g * (flops / 6) ** a
        return n_opt, flops / (6 * n_opt)

    def compute_optimal_search(self, flops: float, points: int = 200_001) -> tuple[float, float]:
        """The same optimum by brute force: L along C = 6ND on a fine log grid of N (a check)."""
        _checks.at_least("ChinchillaFit.compute_optimal_search", 1, flops=flops)
        n = torch.logspace(math.log10(flops / 6) * 0.2, math.log10(flops / 6) * 0.8, points, dtype=torch.float64)
        best = n[torch.argmin(self.loss(n, flops / (6 * n)))].item()
        return best, flops / (6 * best)


# Hoffmann et al. 2022, approach 3 (the published parametric fit).
CHINCHILLA = ChinchillaFit(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
# Besiroglu et al. 2024, "Chinchilla Scaling: A replication attempt", refit of approach 3.
BESIROGLU = ChinchillaFit(E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)
