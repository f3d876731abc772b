"""The recall grid's Ray backend: wall time of the same 6 points on 1 and 2 local Ray workers.

usage: python benchmarks/mqar_ray.py [--steps 150] [--cluster-workers 8 16 32] [--json PATH]

Six grid points (Zoology's MQAR, L = 64, P = 8: attention, hybrid and conv_attention at width
16, each at two learning rates), ``--steps`` steps each with no early stopping, run through
``run_grid(..., backend="ray")`` on a fresh local Ray of 1 and then 2 workers (one CPU and one
torch thread per task). Printed: the wall time of each run (Ray's start and stop included),
the mean time of one point (from the 1-worker run, less Ray's start and stop), and the time
k workers would take for the same points, ceil(points / k) · per-point + start-up, and for
the full grid from the pilot's worst-case point costs (``mqar.projected_seconds``). The
machine's load average is printed with the figures: on a shared machine a second worker
only helps when a core is free. Both runs must give the same results, point by point.
"""
import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from attnlab.bench import format_table
from attnlab.experiments import mqar as lab


def points(steps: int) -> list:
    common = dict(seq_len=64, n_pairs=8, steps=steps, eval_every=steps, warmup=10, solved_at=2.0)
    return [lab.GridPoint(a, 16, lr=lr, **common) for a in ("attention", "hybrid", "conv_attention")
            for lr in (3e-3, 1e-2)]


def timed_run(workers: int, steps: int, folder: Path) -> tuple[float, list]:
    start = time.perf_counter()
    result = lab.run_grid(points(steps), folder / f"w{workers}.json", stages=("scan",), backend="ray",
                          workers=workers, progress=False)
    return time.perf_counter() - start, result["points"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--cluster-workers", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--json", help="also write the figures and their provenance to this file")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        runs = {w: timed_run(w, args.steps, Path(folder)) for w in (1, 2)}
    load_after = os.getloadavg()[0]
    same = [(r1["param_hash"], r1["test_accuracy"]) for r1 in runs[1][1]] == [
        (r2["param_hash"], r2["test_accuracy"]) for r2 in runs[2][1]]
    n = len(runs[1][1])
    per_point = sum(r["seconds"] for r in runs[1][1]) / n
    overhead = runs[1][0] - per_point * n                      # Ray's start, stop and scheduling
    rows = [{"workers": w, "wall s": round(runs[w][0], 1), "speed-up": round(runs[1][0] / runs[w][0], 2)}
            for w in (1, 2)]
    print(f"{n} points, {args.steps} steps each; mean point {per_point:.1f} s; Ray start-up and stop "
          f"about {overhead:.1f} s; results identical on 1 and 2 workers: {same}; load average "
          f"{load_before:.1f} before, {load_after:.1f} after ({os.cpu_count()} cpus)")
    print(format_table(rows, floatfmt=".3g"))
    projected = [{"workers": k, "these 6 points s": round(math.ceil(n / k) * per_point + overhead, 1),
                  "full grid h": round((lab.projected_seconds(k) + 2 * overhead) / 3600, 2)}
                 for k in [1, 2, *args.cluster_workers]]
    print("projected on k workers (these points: ceil(points / k) x mean point + start-up; the grid: "
          "the pilot's worst-case costs, longest first, both stages):")
    print(format_table(projected, floatfmt=".4g"))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": "python benchmarks/mqar_ray.py " + " ".join(sys.argv[1:]), "torch": torch.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} cpus", "date": time.strftime("%Y-%m-%d"),
            "steps": args.steps, "runs": rows, "per_point_s": round(per_point, 2),
            "overhead_s": round(overhead, 2), "identical": same, "projected": projected,
            "load_average": [load_before, load_after]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
