"""What every sweep in this package shares: the header of its data file, its resumable loop, and
the shipped file's loader.

A sweep is a list of points (dataclasses) and a function that trains one point and returns a
dict. :func:`run_points` skips the points already in ``out`` (with ``resume``), runs the rest in
``jobs`` processes of one torch thread each, and rewrites ``out`` after every point, so a run
stopped at any moment loses only the points in flight.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path

import torch


def header(command: str, **fields) -> dict:
    """The record a data file starts with: the command that wrote it, ``fields``, and where it ran."""
    return {"command": command, **fields, "torch": torch.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


def _one_thread(run_point: Callable, point) -> dict:
    torch.set_num_threads(1)
    return run_point(point)


def run_points(points: Sequence, run_point: Callable, *, key: Callable, head: dict,
               out: Path | None = None, resume: bool = False, jobs: int = 1,
               order: Callable | None = None, sort: Callable | None = None,
               indent: int | None = None, progress: bool = True, desc: str = "sweep",
               executor: Callable | None = None) -> dict:
    """Run ``run_point`` on every point not yet in ``out`` and return ``{**head, "points": [...]}``.

    key: a point's identity, for a point or for its result dict (what ``resume`` skips).
    order: the order to run the missing points in (longest first keeps two workers busy).
    sort: the order of the results in the file (default: ``key``).
    indent: JSON indentation of the file (None: compact).
    executor: ``todo -> iterator of results`` in any order, instead of ``jobs`` local processes
        (the Ray backend, ``attnlab.experiments._ray.ray_executor``).
    """
    results = json.loads(out.read_text())["points"] if resume and out is not None and out.exists() else []
    done = {key(r) for r in results}
    todo = [p for p in points if key(p) not in done]
    if order is not None:
        todo.sort(key=order)

    def save():
        if out is not None:
            results.sort(key=sort or key)
            layout = {"indent": indent} if indent is not None else {"separators": (",", ":")}
            out.write_text(json.dumps({**head, "points": results}, **layout) + "\n")

    def finished():
        if executor is not None:
            yield from executor(todo)
            return
        if jobs == 1:
            yield from map(run_point, todo)
            return
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(jobs) as pool:
            futures = [pool.submit(_one_thread, run_point, p) for p in todo]
            yield from (f.result() for f in as_completed(futures))

    from tqdm.auto import tqdm

    for result in tqdm(finished(), total=len(todo), desc=desc, disable=not progress):
        results.append(result)
        save()
    save()
    return {**head, "points": results}


def sweep_args(description: str, data_file: str, argv=None, extra=None) -> argparse.Namespace:
    """The options every small sweep takes (``--smoke``, ``--resume``, ``--out``, default
    ``attnlab/data/<data_file>``), plus any that ``extra(parser)`` adds, parsed; torch is set to
    one thread, as every point runs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--smoke", action="store_true", help="one short run, nothing written")
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --out")
    parser.add_argument("--out", type=Path,
                        default=Path(str(resources.files("attnlab").joinpath("data", data_file))))
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    return args


def load_data(name: str) -> dict:
    """A precomputed sweep shipped in ``attnlab/data/`` (its header records the command that wrote it)."""
    return json.loads(resources.files("attnlab").joinpath("data", name).read_text())


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n − 1; 0 for one value) of a sweep's seeds."""
    n = len(values)
    mean = sum(values) / n
    return mean, (math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0)
