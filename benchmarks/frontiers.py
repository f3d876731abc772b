"""Chapter 14's simulations against their references: time ratios measured in one run.

usage: python benchmarks/frontiers.py [--n 2048] [--devices 1 4 8] [--capacities 0.125 0.5 1.0]

Ring attention (P virtual devices in a Python loop) and quantised attention (integer products
simulated in float64) are teaching simulations: they are *slower* than torch SDPA on one CPU,
and this table says by how much. Mixture-of-Depths saves real compute: its time against the
full block (capacity 1) is the saving, next to the FLOP fraction the chapter derives.
b = 1, 4 heads, d = 64 for attention; b = 4, d_model = 128, 4 heads for the MoD block.
"""
import argparse

import torch
import torch.nn.functional as F

from attnlab.bench import format_table, time_fn
from attnlab.mod import MixtureOfDepths, block_flops_fraction
from attnlab.quant import quantized_attention
from attnlab.ring import ring_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--capacities", type=float, nargs="+", default=[0.125, 0.5, 1.0])
    args = parser.parse_args()

    q, k, v = (torch.randn(1, 4, args.n, 64) for _ in range(3))
    t_sdpa = time_fn(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), repeats=3)
    label = f"form (causal, n = {args.n})"
    rows = [{label: "torch SDPA", "ms": 1e3 * t_sdpa, "× SDPA": 1.0}]
    for devices in args.devices:
        t = time_fn(lambda: ring_attention(q, k, v, devices, causal=True), repeats=3)
        rows.append({label: f"ring attention, P = {devices}", "ms": 1e3 * t, "× SDPA": t / t_sdpa})
    for smooth in (False, True):
        t = time_fn(lambda: quantized_attention(q, k, v, smooth_k=smooth, causal=True), repeats=3)
        rows.append({label: f"simulated INT8 QKᵀ{', K smoothed' if smooth else ''}", "ms": 1e3 * t, "× SDPA": t / t_sdpa})
    print(format_table(rows))

    torch.manual_seed(0)
    x = torch.randn(4, 1024, 128)
    layers = {c: MixtureOfDepths(128, 4, c) for c in {*args.capacities, 1.0}}
    with torch.no_grad():
        times = {c: time_fn(lambda: layers[c](x), repeats=3) for c in args.capacities}
        full = times.get(1.0) or time_fn(lambda: layers[1.0](x), repeats=3)
    print(format_table([{"MoD capacity C": c, "ms": 1e3 * t, "time / C = 1": t / full,
                         "FLOP fraction": block_flops_fraction(c, 1024, 128)} for c, t in times.items()]))


if __name__ == "__main__":
    main()
