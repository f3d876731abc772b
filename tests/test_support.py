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


def test_threads_sets_and_restores_the_count_even_on_error():
    import pytest
    import torch

    from attnlab.bench import threads

    before = torch.get_num_threads()
    with threads(2) as n:
        assert n == 2 and torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="inside"):
        with threads(3):
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="threads: n must be an integer >= 1"):
            with threads(bad):
                pass


def test_count_ops_counts_calls_and_elements_exactly():
    import torch

    from attnlab.bench import count_ops

    a, b = torch.ones(3, 4), torch.ones(4, 5)
    assert count_ops(lambda: a @ b) == {"calls": 1, "elements": 15}
    assert count_ops(lambda: [a + 1 for _ in range(7)]) == {"calls": 7, "elements": 84}
    x = torch.ones(8, requires_grad=True)
    loop = count_ops(lambda: sum(x[i] * 2 for i in range(8)).backward())
    vector = count_ops(lambda: (x * 2).sum().backward())
    assert loop["calls"] > 4 * vector["calls"]  # a Python loop makes O(L) calls
