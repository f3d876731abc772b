"""Timing, counting and peak-memory helpers shared by the notebooks and ``benchmarks/``.

The machine, its load, its BLAS and the thread count all change the seconds, so the book
asserts no measured time, ratio of times or exponent fitted to times. A claim about growth or
speed-up is asserted on counts (FLOPs from ``torch.utils.flop_counter.FlopCounterMode``,
operator calls and elements from :func:`count_ops`, bytes) or on shipped precomputed results,
and the live timing is shown beside it, taken inside :func:`threads` so that it is comparable.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

# glibc raises its mmap threshold after the first large free, so later large blocks come
# from the heap and ru_maxrss over-reports a loop that allocates and frees big tensors.
# A fixed threshold returns large blocks to the system on free; see research/toolchain.md.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


@contextmanager
def threads(n: int) -> Iterator[int]:
    """Run the ``with`` body with torch's intra-op thread count set to ``n``, then restore it.

    Timings, and the growth exponents fitted to them, depend on the thread count: a
    multi-threaded kernel has a fixed start-up cost that flattens the small sizes, and how
    much it speeds up the large ones depends on the cores and what else runs on them. One
    thread makes timings comparable across machines; notebooks print the count beside
    every table of times.

    >>> with threads(1):
    ...     pass
    """
    import torch

    if not isinstance(n, int) or n < 1:
        raise ValueError(f"threads: n must be an integer >= 1, got {n!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


def time_fn(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 5) -> float:
    """Median wall time of ``fn()`` in seconds, after ``warmup`` untimed calls."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def count_ops(fn: Callable[[], object]) -> dict[str, int]:
    """Run ``fn()`` once and count what it asks of PyTorch: operator calls and elements written.

    Returns ``{"calls": ..., "elements": ...}``: the number of ATen operator calls made while
    ``fn`` runs (its backward pass included, if ``fn`` calls ``backward()``), and the total
    number of elements in the tensors those calls return. Unlike a time, both are exact and
    the same on every machine and thread count (for one PyTorch version and device), so a claim about how
    a form's cost grows can be asserted on them: a Python loop over L steps makes O(L) calls,
    and a backward pass that builds L full-size gradients writes O(L²) elements. Elements of
    views are counted too, so read ``elements`` as an upper bound on what is written.
    For FLOPs use ``torch.utils.flop_counter.FlopCounterMode``.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode  # what FlopCounterMode builds on
    from torch.utils._pytree import tree_flatten

    counts = {"calls": 0, "elements": 0}

    class _Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            counts["calls"] += 1
            counts["elements"] += sum(t.numel() for t in tree_flatten(out)[0]
                                      if isinstance(t, torch.Tensor))
            return out

    with _Counter():
        fn()
    return counts


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of log y against log x: the exponent p in y ≈ c · x^p."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"x and y need the same length >= 2, got {len(x)} and {len(y)}")
    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def peak_memory_bytes(setup: str, statement: str, *, timeout: float = 300) -> int:
    """Peak resident memory that ``statement`` adds on top of ``setup``, in a fresh process.

    Both are Python source run in a new interpreter with glibc's mmap threshold fixed
    (``MALLOC_ENV``); the result is the peak resident size during the statement (Linux's
    VmHWM, reset after the setup) minus the resident size after the setup. Elsewhere the
    high-water mark cannot be reset and the result may under-report. The setup should allocate the inputs, so that only the computation
    is counted. On CUDA use ``torch.cuda.max_memory_allocated`` instead.
    """
    program = textwrap.dedent(
        """
        import json, resource, sys
        def status(field):
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))
        def max_rss():  # ru_maxrss is in KiB on Linux, bytes on macOS
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        {setup}
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the high-water mark, so the setup's own peak is not counted
            base, peak = status("VmRSS:"), lambda: status("VmHWM:")
        except OSError:  # not Linux: the high-water mark cannot be reset, the delta may under-report
            base, peak = max_rss(), max_rss
        {statement}
        print(json.dumps({{"base": base, "peak": peak()}}))
        """
    ).format(setup=textwrap.dedent(setup).strip(), statement=textwrap.dedent(statement).strip())
    env = {**os.environ, **MALLOC_ENV}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"peak_memory_bytes: the measured program failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return max(result["peak"] - result["base"], 0)


def format_table(rows: Sequence[dict], floatfmt: str = ".3g") -> str:
    """A plain-text table of ``rows`` (dicts), for benchmarks and notebooks; a missing entry is left blank."""
    if not rows:
        return ""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[f"{r[k]:{floatfmt}}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]

    def line(vals):
        return "  ".join(v.rjust(w) for v, w in zip(vals, widths))

    return "\n".join([line(keys), line(["-" * w for w in widths]), *map(line, cells)])
