"""The numerical-agreement rule every alternative form of a computation is tested by.

A fast or alternative form agrees with the reference when its error against a float64
reference is at most twice the error of the fp32 baseline (torch's own SDPA, or the fp32
reference form) against the same float64 reference. This is the rule of the FlashAttention
authors; a fixed tolerance such as 1e-6 is defeated by random inputs of growing size.
"""
from __future__ import annotations

import torch

ULP_FLOOR = 2


def max_abs_error(x: torch.Tensor, exact: torch.Tensor) -> float:
    """max |x - exact| (broadcast together), computed in float64."""
    try:
        torch.broadcast_shapes(x.shape, exact.shape)
    except RuntimeError:
        raise ValueError(f"max_abs_error: x and exact must broadcast to one shape, got {tuple(x.shape)} and "
                         f"{tuple(exact.shape)}") from None
    return (x.double() - exact.double()).abs().max().item() if x.numel() else 0.0


def error_ratio(
    candidate: torch.Tensor, baseline: torch.Tensor, exact: torch.Tensor, *, scale: float | None = None
) -> float:
    """(error of candidate) / (error of baseline), both measured against ``exact``.

    The baseline's error is floored at ``ULP_FLOOR`` units in the last place of ``scale``
    (default: the largest exact value; for attention pass max |v|, since the output is a
    weighted average of the value rows and rounds like them): on tiny outputs the maximum error is a noisy statistic, and differences of a
    few rounding steps say nothing about which form is more accurate.
    """
    if candidate.shape != exact.shape or baseline.shape != exact.shape:
        raise ValueError(
            f"candidate {tuple(candidate.shape)}, baseline {tuple(baseline.shape)} and "
            f"exact {tuple(exact.shape)} must have the same shape"
        )
    if scale is None:
        scale = exact.abs().max().item() if exact.numel() else 1.0
    floor = ULP_FLOOR * torch.finfo(baseline.dtype).eps * max(scale, 1e-30)
    return max_abs_error(candidate, exact) / max(max_abs_error(baseline, exact), floor)


def agrees(
    candidate: torch.Tensor, baseline: torch.Tensor, exact: torch.Tensor, *,
    factor: float = 2.0, scale: float | None = None,
) -> bool:
    """True when the candidate's error against ``exact`` is at most ``factor`` times the baseline's."""
    return error_ratio(candidate, baseline, exact, scale=scale) <= factor
