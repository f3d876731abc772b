"""Argument checks shared by the modules.

Each raises a TypeError (wrong type or dtype) or a ValueError (wrong value) whose message names
the function, the argument, what it got and what it needed, so bad input never surfaces as a
raw error from deep inside torch. Shape checks stay in the modules: only they know the shape
letters to name.
"""
from __future__ import annotations

import operator

import torch


def floats(fn: str, **tensors) -> None:
    """Each argument is a floating-point tensor (None: an optional argument left out)."""
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{fn}: {name} must be a floating-point tensor, got {t.dtype}")


def ints(fn: str, minimum: int = 1, **values) -> None:
    """Each argument is an int >= ``minimum`` (a count, a length, a block size)."""
    need = {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
    for name, value in values.items():
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{fn}: {name} must be {need}, got {type(value).__name__} {value!r}") from None
        if value < minimum:
            raise ValueError(f"{fn}: {name} must be {need}, got {value}")


def at_least(fn: str, minimum: float, **values) -> None:
    """Each argument is a number >= ``minimum`` (counting formulas also take floats such as 1e6)."""
    for name, value in values.items():
        if not value >= minimum:                       # also catches NaN
            raise ValueError(f"{fn}: {name} must be >= {minimum}, got {value}")
