"""Standard, SDPA, tiled, sliding-window and linear attention: time, peak memory, error, growth.

usage: python benchmarks/attention_bench.py [--lengths 256 512 ... 16384] [--window 64]
                                            [--memory-lengths ...] [--json PATH]

The measured replacement for Lecture 15's benchmark tables (chapter 09). Non-causal forward,
b = 1, h = 4, d = 64, i.i.d. normal inputs. Time: median of 3 after a warm-up. Peak memory: what
one forward adds on top of its inputs, in a fresh process (attnlab.bench.peak_memory_bytes).
Error: relative Frobenius error against float64 SDPA. The naive form stops where its score
matrix would reach 4 GiB. ``--json`` writes the rows and the run's provenance; the book ships
such a file as ``attnlab/data/attention_bench.json``, made by

    python benchmarks/attention_bench.py --json src/attnlab/data/attention_bench.json
"""
import argparse
import datetime
import json
import os
import platform
import sys

import torch

from attnlab.bench import format_table
from attnlab.tradeoff import crossover_length, forms, growth_exponents, measure, pivot

DEFAULT_LENGTHS = [256, 512, 1024, 2048, 4096, 8192, 16384]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=DEFAULT_LENGTHS)
    parser.add_argument("--memory-lengths", type=int, nargs="*", default=None,
                        help="lengths at which to measure peak memory (default: all)")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--json", help="also write the rows and their provenance to this file")
    args = parser.parse_args()
    memory = True if args.memory_lengths is None else args.memory_lengths
    rows = measure(args.lengths, window=args.window, memory=memory, progress=True)

    print("forward time, ms (b=1, h=4, d=64, non-causal)")
    print(format_table(pivot(rows, "ms")))
    print("\npeak memory added by one forward, MB")
    print(format_table(pivot(rows, "MB")))
    print("\nrelative error against float64 exact attention (i.i.d. normal inputs)")
    print(format_table(pivot(rows, "rel error"), floatfmt=".2e"))
    skipped = [f"n={r['n']} {r['form']}: {r['note']}" for r in rows if "note" in r]
    if skipped:
        print("\n" + "\n".join(skipped))
    slopes = growth_exponents(rows)
    print("\nlog-log slope of time against n for n >= 1024 (2 = quadratic, 1 = linear)")
    print(format_table([{"form": k, "slope": v} for k, v in slopes.items()], floatfmt=".2f"))
    times = {r["form"]: [] for r in rows}
    for r in rows:
        times[r["form"]].append(r.get("ms"))
    linear = [f.name for f in forms(args.window)][-1]
    cross = crossover_length(args.lengths, times["SDPA"], times[linear])
    print(f"\n{linear} is faster than SDPA from n ≈ {cross:.0f}" if cross else f"\n{linear} never beats SDPA here")

    if args.json:
        provenance = {
            "command": "python " + " ".join(sys.argv),
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
            "threads": torch.get_num_threads(),
            "setup": "non-causal forward, b=1, h=4, d=64, i.i.d. N(0,1) inputs, seed 0; median of 3 after a warm-up",
        }
        with open(args.json, "w") as f:
            json.dump({"provenance": provenance, "rows": rows}, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
