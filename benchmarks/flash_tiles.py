"""Tiled attention (attnlab.flash) against torch SDPA and the naive reference: time and peak memory.

usage: python benchmarks/flash_tiles.py [--lengths 2048 4096] [--blocks 64 128 256 512] [--memory-n 8192]

Time: forward, median of repeats, as a multiple of torch SDPA measured in the same run.
Peak memory: the memory a forward adds on top of its inputs, each form in a fresh process with
glibc's mmap threshold fixed (attnlab.bench.peak_memory_bytes). b = 1, 4 heads, d = 64.
"""
import argparse

import torch
import torch.nn.functional as F

from attnlab.attention import scaled_dot_product_attention
from attnlab.bench import format_table, peak_memory_bytes, time_fn
from attnlab.flash import flash_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--blocks", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--memory-n", type=int, default=8192)
    args = parser.parse_args()
    rows = []
    for n in args.lengths:
        q, k, v = (torch.randn(1, 4, n, 64) for _ in range(3))
        t_sdpa = time_fn(lambda: F.scaled_dot_product_attention(q, k, v), repeats=3)
        row = {"n": n, "SDPA ms": 1e3 * t_sdpa,
               "naive ×": time_fn(lambda: scaled_dot_product_attention(q, k, v), repeats=3) / t_sdpa}
        for block in args.blocks:
            row[f"tiles {block} ×"] = time_fn(lambda: flash_attention(q, k, v, block_q=block, block_k=block), repeats=3) / t_sdpa
        rows.append(row)
    print("forward time as a multiple of torch SDPA (b=1, h=4, d=64)")
    print(format_table(rows))

    n = args.memory_n
    setup = f"import torch\nfrom attnlab.attention import scaled_dot_product_attention\nfrom attnlab.flash import flash_attention\nq, k, v = (torch.randn(1, 4, {n}, 64) for _ in range(3))"
    forms = {"naive (attnlab reference)": "out = scaled_dot_product_attention(q, k, v)",
             "tiled (attnlab.flash, 256)": "out = flash_attention(q, k, v)",
             "torch SDPA": "out = torch.nn.functional.scaled_dot_product_attention(q, k, v)"}
    mem = {name: peak_memory_bytes(setup, stmt) for name, stmt in forms.items()}
    naive = mem["naive (attnlab reference)"]
    print(f"\npeak memory added by one forward at n = {n} (b=1, h=4, d=64); inputs and output are "
          f"{4 * 4 * n * 64 * 4 / 1e6:.0f} MB")
    print(format_table([{"form": k, "MB": v / 1e6, "fraction of naive": v / naive} for k, v in mem.items()]))


if __name__ == "__main__":
    main()
