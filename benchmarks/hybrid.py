"""Hybrid-architecture mixers: the forms of each, timed against each other in one run.

usage: python benchmarks/hybrid.py [--lengths 256 512 1024 2048] [--repeats 3] [--threads 1]

1. A long causal convolution (the Hyena operator's): the FFT form against the direct
   Toeplitz product, 8 channels; fitted exponents of time against N.
2. The RG-LRU recurrence h_t = a_t h_{t-1} + x_t, forward + backward, b = 4, d = 64: the
   doubling scan against the loop.
3. One forward pass of a toy HybridLM (d_model 64, 8 layers) with a fraction r of attention
   layers, the rest Mamba: time against N and its fitted exponent.
Errors are the largest |difference| from a float64 run of the reference form.
"""
import argparse

import torch

from attnlab.bench import format_table, loglog_slope, time_fn
from attnlab.hybrid import HybridConfig, HybridLM, LayerSpec
from attnlab.hyena import causal_conv_direct
from attnlab.numerics import max_abs_error
from attnlab.rglru import linear_recurrence
from attnlab.ssm import lti_convolution


def convolution(lengths, repeats):
    rows = []
    for n in lengths:
        g = torch.Generator().manual_seed(n)
        u, h = torch.randn(1, 8, n, generator=g), torch.randn(8, n, generator=g)
        exact = causal_conv_direct(u.double(), h.double())
        fft, direct = (1e3 * time_fn(lambda f=f: f(u, h), repeats=repeats) for f in (lti_convolution, causal_conv_direct))
        rows.append({"N": n, "FFT (ms)": fft, "direct (ms)": direct, "direct / FFT": direct / fft,
                     "FFT error": max_abs_error(lti_convolution(u, h), exact)})
    print(format_table(rows))
    print(f"exponents: FFT {loglog_slope(lengths, [r['FFT (ms)'] for r in rows]):.2f}, "
          f"direct {loglog_slope(lengths, [r['direct (ms)'] for r in rows]):.2f}\n")


def recurrence(lengths, repeats):
    rows = []
    for n in lengths:
        g = torch.Generator().manual_seed(n)
        a = torch.rand(4, n, 64, generator=g).requires_grad_()
        x = torch.randn(4, n, 64, generator=g).requires_grad_()

        def run(method):
            linear_recurrence(a, x, method=method).square().sum().backward()

        loop, scan = (1e3 * time_fn(lambda m=m: run(m), repeats=repeats) for m in ("loop", "scan"))
        exact = linear_recurrence(a.double(), x.double())
        rows.append({"N": n, "loop (ms)": loop, "scan (ms)": scan, "loop / scan": loop / scan,
                     "scan error": max_abs_error(linear_recurrence(a, x, method="scan"), exact)})
    print(format_table(rows))
    print()


def hybrid_forward(lengths, repeats):
    config = HybridConfig(vocab=64, d_model=64, n_heads=4, d_state=8)
    rows, times = [], {}
    for r, pattern in (("0", "MMMMMMMM"), ("1/4", "MMMAMMMA"), ("1", "AAAAAAAA")):
        torch.manual_seed(0)
        model = HybridLM([LayerSpec("attention" if c == "A" else "mamba") for c in pattern], config).eval()
        times[r] = []
        for n in lengths:
            tokens = torch.randint(0, 64, (1, n))
            with torch.no_grad():
                times[r].append(1e3 * time_fn(lambda: model(tokens), repeats=repeats))
    for i, n in enumerate(lengths):
        rows.append({"N": n, **{f"r = {r} (ms)": t[i] for r, t in times.items()}})
    print(format_table(rows))
    print("exponents: " + ", ".join(f"r = {r}: {loglog_slope(lengths, t):.2f}" for r, t in times.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    convolution(args.lengths, args.repeats)
    recurrence(args.lengths, args.repeats)
    hybrid_forward(args.lengths, args.repeats)


if __name__ == "__main__":
    main()
