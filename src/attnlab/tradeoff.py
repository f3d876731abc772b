"""The speed / memory / accuracy trade-off of attention forms, measured in one run.

One table replaces Lecture 15's invented ones: every form below computes (or approximates)
non-causal attention softmax(QKᵀ/√d)V on the same inputs; for each length n we record the
median forward time, the peak memory the forward adds on top of its inputs (each in a fresh
process, ``attnlab.bench.peak_memory_bytes``), and the relative error against exact attention
computed in float64 (torch SDPA on float64 copies of the inputs).

    rows = measure([256, 1024, 4096])
    print(format_table(rows))

Shapes: q, k, v (1, h, n, d). A form is a Python expression in q, k, v so that the same text
is timed here and run in the fresh process that measures memory.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import _checks
from .bench import loglog_slope, peak_memory_bytes, time_fn

IMPORTS = """
import torch
import torch.nn.functional as F
from attnlab.attention import scaled_dot_product_attention
from attnlab.flash import flash_attention
from attnlab.linear import linear_attention
from attnlab.sparse import sliding_window_attention
"""
NAIVE_LIMIT_BYTES = 4 * 2**30  # the naive form stops where its (h, n, n) fp32 score matrix reaches 4 GiB


@dataclass(frozen=True)
class Form:
    """One way to compute attention: its name, the expression that runs it, and what it costs."""

    name: str
    call: str        # an expression in q, k, v
    exact: bool      # computes softmax attention exactly (up to rounding)
    cost: str        # time and extra memory, in n (length), d (head dim), w (window), m (features)


def forms(window: int = 64) -> list[Form]:
    """The five forms of the chapter 09 benchmark, a sliding window of radius ``window``."""
    _checks.ints("forms", window=window, minimum=0)
    return [
        Form("naive", "scaled_dot_product_attention(q, k, v)", True, "O(n²d) time, O(n²) memory"),
        Form("SDPA", "F.scaled_dot_product_attention(q, k, v)", True, "O(n²d) time, fused kernel"),
        Form("tiled", "flash_attention(q, k, v)", True, "O(n²d) time, O(n) memory"),
        Form(f"window {window}", f"sliding_window_attention(q, k, v, {window})", False, "O(nwd) time, O(nw) memory"),
        Form("linear (elu+1)", "linear_attention(q, k, v)", False, "O(nd²) time, O(d²) state"),
    ]


def _namespace() -> dict:
    namespace: dict = {}
    exec(IMPORTS, namespace)
    return namespace


def make_inputs(n: int, *, heads: int = 4, d: int = 64, seed: int = 0, dtype=torch.float32):
    """q, k, v of shape (1, heads, n, d), i.i.d. standard normal from ``seed``."""
    _checks.ints("make_inputs", n=n, heads=heads, d=d)
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, n, d, generator=g, dtype=dtype) for _ in range(3))


def score_matrix_bytes(n: int, *, heads: int = 4, batch: int = 1, bytes_per_element: int = 4) -> int:
    """Bytes of the (b, h, n, n) score matrix the naive form materialises."""
    _checks.at_least("score_matrix_bytes", 0, n=n, heads=heads, batch=batch, bytes_per_element=bytes_per_element)
    return batch * heads * n * n * bytes_per_element


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖_F / ‖ref‖_F."""
    if out.shape != ref.shape:
        raise ValueError(f"relative_error: out and ref must have the same shape, "
                         f"got {tuple(out.shape)} and {tuple(ref.shape)}")
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def measure(lengths: Sequence[int], *, window: int = 64, heads: int = 4, d: int = 64, repeats: int = 3,
            memory: bool | Sequence[int] = True, naive_limit: int = NAIVE_LIMIT_BYTES,
            progress: bool = False) -> list[dict]:
    """Time, peak memory and relative error of every form at every length.

    Returns one row per (n, form): ``n``, ``form``, ``ms`` (median forward), ``MB`` (peak memory
    the forward adds, when measured: ``memory`` is True for every length, False for none, or
    the lengths to measure), ``rel error`` (against float64 SDPA on the same inputs), and
    ``note`` where a form was skipped. The naive form is skipped once its score matrix would
    reach ``naive_limit`` bytes.
    """
    namespace = _namespace()
    chosen = forms(window)
    memory_lengths = set(lengths if memory is True else (memory or ()))
    rows = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(lengths) * len(chosen), desc="attention forms", leave=False)
    for n in lengths:
        q, k, v = make_inputs(n, heads=heads, d=d)
        scope = {**namespace, "q": q, "k": k, "v": v}
        reference = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
        for form in chosen:
            row: dict = {"n": n, "form": form.name}
            if form.name == "naive" and score_matrix_bytes(n, heads=heads) >= naive_limit:
                row["note"] = f"skipped: score matrix {score_matrix_bytes(n, heads=heads) / 2**30:.1f} GiB"
            else:
                code = compile(form.call, form.name, "eval")
                out = eval(code, scope)
                row["ms"] = 1e3 * time_fn(lambda: eval(code, scope), repeats=repeats)
                if n in memory_lengths:
                    setup = f"{IMPORTS}\nq, k, v = (torch.randn(1, {heads}, {n}, {d}) for _ in range(3))"
                    row["MB"] = peak_memory_bytes(setup, f"out = {form.call}") / 1e6
                row["rel error"] = relative_error(out, reference)
            rows.append(row)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return rows


def growth_exponents(rows: Sequence[dict], *, key: str = "ms", min_n: int = 1024) -> dict[str, float]:
    """Per form, the log-log slope of ``key`` against n over lengths ≥ ``min_n`` (≈2 quadratic, ≈1 linear).

    A form measured at fewer than two such lengths has no slope and is left out.
    """
    slopes = {}
    for name in dict.fromkeys(r["form"] for r in rows):
        points = [(r["n"], r[key]) for r in rows if r["form"] == name and key in r and r["n"] >= min_n]
        if len(points) >= 2:
            slopes[name] = loglog_slope(*zip(*points))
    return slopes


def crossover_length(lengths: Sequence[int], slow: Sequence[float], fast: Sequence[float]) -> float | None:
    """The n at which ``fast`` first drops below ``slow`` (times at ``lengths``), interpolated in log-log.

    None if it never does over the range; lengths[0] if it already is at the start.
    """
    if not 0 < len(lengths) == len(slow) == len(fast):
        raise ValueError(f"crossover_length: lengths, slow and fast must be non-empty and of one length, "
                         f"got {len(lengths)}, {len(slow)}, {len(fast)}")
    ratios = [math.log(f / s) for s, f in zip(slow, fast)]
    if ratios[0] < 0:
        return float(lengths[0])
    for (n0, r0), (n1, r1) in zip(zip(lengths, ratios), zip(lengths[1:], ratios[1:])):
        if r1 < 0 <= r0:
            t = r0 / (r0 - r1)
            return math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
    return None


def pivot(rows: Sequence[dict], key: str) -> list[dict]:
    """One row per n, one column per form, holding ``key`` (blank where a form was skipped)."""
    table: dict[int, dict] = {}
    for r in rows:
        line = table.setdefault(r["n"], {"n": r["n"]})
        if key in r:
            line[r["form"]] = r[key]
    return list(table.values())


def load_precomputed() -> dict:
    """The full-size benchmark shipped with the package: ``{"provenance": {...}, "rows": [...]}``.

    Made by ``python benchmarks/attention_bench.py --json src/attnlab/data/attention_bench.json``;
    the provenance records that command, the machine, torch's version and the date.
    """
    from importlib.resources import files

    return json.loads(files("attnlab.data").joinpath("attention_bench.json").read_text())
