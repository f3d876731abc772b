"""numerics and bench helpers."""

import pytest
import torch

from attnlab.bench import format_table, loglog_slope, peak_memory_bytes, time_fn
from attnlab.numerics import agrees, error_ratio, max_abs_error


def test_error_ratio_rule():
    exact = torch.tensor([1.0, 2.0], dtype=torch.float64)
    base = torch.tensor([1.0 + 1e-3, 2.0])
    assert error_ratio(base + 1e-3, base, exact) == pytest.approx(2.0, rel=1e-3)
    assert agrees(base, base, exact) and not agrees(base + 1e-2, base, exact)
    assert max_abs_error(base, exact) == pytest.approx(1e-3, rel=1e-4)
    with pytest.raises(ValueError, match="same shape"):
        error_ratio(base, base[:1], exact)


def test_loglog_slope_recovers_exponent():
    xs = [1, 2, 4, 8]
    assert loglog_slope(xs, [3 * x**2 for x in xs]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        loglog_slope([1], [1])


def test_time_fn_and_table():
    assert time_fn(lambda: sum(range(100)), repeats=3) >= 0
    table = format_table([{"n": 1, "ratio": 2.5}, {"n": 10, "ratio": 0.25}])
    assert table.splitlines()[0].split() == ["n", "ratio"] and "0.25" in table


def test_peak_memory_sees_a_large_allocation():
    added = peak_memory_bytes("import torch", "x = torch.ones(64 * 2**20 // 4); x += 1")
    assert 50 * 2**20 < added < 200 * 2**20
