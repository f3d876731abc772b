"""Reference attention (attnlab) against torch's fused SDPA: time ratio and peak memory.

usage: python benchmarks/sdpa.py [--lengths 512 1024 2048 4096] [--heads 4] [--dim 64]

Time: median of repeats after a warm-up, both forms in the same run; the ratio is what counts.
Peak memory: measured in a fresh process per form and length with glibc's mmap threshold fixed
(attnlab.bench.peak_memory_bytes), on top of the inputs.
"""
import argparse

import torch
import torch.nn.functional as F

from attnlab.attention import scaled_dot_product_attention
from attnlab.bench import format_table, loglog_slope, peak_memory_bytes, time_fn

FORMS = {
    "attnlab": "from attnlab.attention import scaled_dot_product_attention as attend",
    "torch SDPA": "from torch.nn.functional import scaled_dot_product_attention as attend",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args()
    rows = []
    for n in args.lengths:
        q, k, v = (torch.randn(1, args.heads, n, args.dim) for _ in range(3))
        t_ours = time_fn(lambda: scaled_dot_product_attention(q, k, v, causal=True), repeats=5)
        t_torch = time_fn(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), repeats=5)
        setup = f"import torch\n{{}}\nq, k, v = (torch.randn(1, {args.heads}, {n}, {args.dim}) for _ in range(3))"
        statement = "out = attend(q, k, v, {})"
        mem = {name: peak_memory_bytes(setup.format(imp), statement.format("causal=True" if name == "attnlab" else "is_causal=True"))
               for name, imp in FORMS.items()}
        rows.append({"n": n, "attnlab ms": 1e3 * t_ours, "SDPA ms": 1e3 * t_torch, "time ratio": t_ours / t_torch,
                     "attnlab MB": mem["attnlab"] / 1e6, "SDPA MB": mem["torch SDPA"] / 1e6,
                     "n×n fp32 MB": 4 * args.heads * n * n / 1e6})
    print(f"causal self-attention, b=1, h={args.heads}, d={args.dim}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(format_table(rows))
    ns = [r["n"] for r in rows]
    if len(ns) > 1:
        print(f"log-log time slope: attnlab {loglog_slope(ns, [r['attnlab ms'] for r in rows]):.2f}, "
              f"SDPA {loglog_slope(ns, [r['SDPA ms'] for r in rows]):.2f}")


if __name__ == "__main__":
    main()
