"""The chapter 09 benchmark's machinery: the forms it runs, its bookkeeping, and the shipped data."""
import pytest
import torch

from attnlab.tradeoff import (
    crossover_length, forms, growth_exponents, load_precomputed, measure, pivot, relative_error, score_matrix_bytes,
)


def test_every_form_runs_and_the_exact_ones_agree():
    rows = measure([64, 100], memory=False, repeats=1)
    assert [r["form"] for r in rows[:5]] == [f.name for f in forms()]
    for r in rows:
        assert r["ms"] > 0
        if r["form"] in ("naive", "SDPA", "tiled"):
            assert r["rel error"] < 1e-6
    # a window of radius 64 covers every key when n = 64, so it is exact there
    assert next(r for r in rows if r["n"] == 64 and r["form"] == "window 64")["rel error"] < 1e-6


def test_naive_form_is_skipped_past_its_limit():
    rows = measure([128], memory=False, repeats=1, naive_limit=score_matrix_bytes(128) - 1)
    naive = next(r for r in rows if r["form"] == "naive")
    assert "ms" not in naive and naive["note"].startswith("skipped")


def test_growth_exponents_recover_known_powers():
    rows = [{"n": n, "form": "quadratic", "ms": 3e-6 * n**2} for n in (1024, 2048, 4096)]
    rows += [{"n": n, "form": "linear", "ms": 5e-3 * n} for n in (512, 1024, 2048, 4096)]
    slopes = growth_exponents(rows)
    assert slopes == pytest.approx({"quadratic": 2.0, "linear": 1.0})


def test_crossover_length_interpolates_in_log_space():
    lengths = [100, 1000, 10000]
    slow = [1.0, 10.0, 100.0]
    assert crossover_length(lengths, slow, [10.0, 10.0, 10.0]) == pytest.approx(1000.0)
    assert crossover_length(lengths, slow, [0.5, 5.0, 50.0]) == 100.0
    assert crossover_length(lengths, slow, [2.0, 20.0, 200.0]) is None


def test_pivot_and_relative_error():
    rows = [{"n": 1, "form": "a", "ms": 1.0}, {"n": 1, "form": "b", "note": "skipped"}, {"n": 2, "form": "a", "ms": 2.0}]
    assert pivot(rows, "ms") == [{"n": 1, "a": 1.0}, {"n": 2, "a": 2.0}]
    x = torch.ones(4)
    assert relative_error(2 * x, x) == pytest.approx(1.0)


def test_shipped_benchmark_has_its_provenance_and_every_form():
    data = load_precomputed()
    assert data["provenance"]["command"].startswith("python benchmarks/attention_bench.py")
    names = {f.name for f in forms()}
    assert {r["form"] for r in data["rows"]} == names
    for r in data["rows"]:
        assert ("ms" in r) != ("note" in r)
