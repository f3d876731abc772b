"""Learning-rate schedules with warmup.

Read alongside: Vaswani et al. 2017, section 5.3 (the "Noam" schedule); Loshchilov & Hutter
2017 (cosine decay); Liu et al. 2020, "On the Variance of the Adaptive Learning Rate and
Beyond" (RAdam), for why Adam wants warmup; Xiong et al. 2020 for why post-LN needs it most.

Steps count from 1.
"""
from __future__ import annotations

import math

from . import _checks


def _check_step(step: int) -> None:
    if step < 1:
        raise ValueError(f"step counts from 1 (the Noam formula divides by sqrt(step)), got {step}")


def noam_lr(step: int, d_model: int, warmup: int = 4000) -> float:
    r"""The Transformer's schedule: :math:`d^{-1/2}\min(t^{-1/2},\; t\,w^{-3/2})`.

    Linear warmup to a peak of :math:`(d\,w)^{-1/2}` at t = w, then decay as t^{-1/2}.
    """
    _check_step(step)
    _checks.at_least("noam_lr", 1, d_model=d_model, warmup=warmup)
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def warmup_cosine_lr(step: int, *, peak: float, warmup: int, total: int, final: float = 0.0) -> float:
    """Linear warmup to ``peak`` over ``warmup`` steps, then cosine decay to ``final`` at ``total``."""
    _check_step(step)
    if step <= warmup:
        return peak * step / warmup
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return final + 0.5 * (peak - final) * (1 + math.cos(math.pi * progress))


def warmup_linear_lr(step: int, *, peak: float, warmup: int, total: int) -> float:
    """Linear warmup to ``peak``, then linear decay to 0 at ``total`` (BERT's schedule)."""
    _check_step(step)
    if step <= warmup:
        return peak * step / warmup
    return peak * max(total - step, 0) / max(total - warmup, 1)
