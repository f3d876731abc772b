"""The selective scan (attnlab.ssm.selective_scan): speed of its forms, and where they break.

usage: python benchmarks/scan.py [--lengths 256 512 1024 2048 4096] [--indexed-max 1024] [--repeats 5]
                                [--chunks 16 32 64 128 256]

1. Time, forward + backward, b = 1, d = 64, n = 16, Mamba's initialisation (A S4D-real,
   Δ = softplus(δ + b_Δ) with Δ log-uniform in [1e-3, 0.1]): the sequential loop over unbind-ed
   steps (the reference), and the others as a speed-up over it, measured in the same run. The
   indexed loop's backward is quadratic; it runs only up to --indexed-max. Errors are the
   largest |difference| of the output against a float64 sequential run.
   Then the chunk size T of the chunked scan at the largest L.
2. A strongly decaying input (Δ = 1, so e^{ΔA} reaches e^{-16} per step): which forms stay finite.
3. The recurrence h_t = a h_{t-1} + x_t in bf16 and fp32: the error stays under δ/(1 − a)
   and does not grow with N.
"""
import argparse
import math

import torch

from attnlab.bench import format_table, loglog_slope, time_fn
from attnlab.numerics import max_abs_error
from attnlab.ssm import recurrence_rounding, s4d_real_init, selective_scan

B, D, N = 1, 64, 16


def mamba_like_inputs(length: int, *, seed: int = 0, dtype=torch.float32):
    """u, δ, A, B, C and the Δ bias of a freshly initialised Mamba layer (δ small, so Δ ≈ softplus(b_Δ))."""
    g = torch.Generator().manual_seed(seed)
    dt = torch.exp(torch.rand(D, generator=g) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    bias = dt + torch.log(-torch.expm1(-dt))
    tensors = (torch.randn(B, D, length, generator=g), 0.1 * torch.randn(B, D, length, generator=g),
               s4d_real_init(D, N), torch.randn(B, N, length, generator=g), torch.randn(B, N, length, generator=g))
    return [t.to(dtype) for t in tensors], bias.to(dtype)


def forward_backward(method: str, tensors, bias, chunk=None):
    leaves = [t.clone().requires_grad_() for t in tensors]

    def run():
        for t in leaves:
            t.grad = None
        selective_scan(*leaves, delta_bias=bias, delta_softplus=True, method=method, chunk=chunk).sum().backward()
    return run


def timing_table(lengths, indexed_max, repeats):
    rows, indexed_times = [], []
    for length in lengths:
        tensors, bias = mamba_like_inputs(length)
        exact = selective_scan(*[t.double() for t in tensors], delta_bias=bias.double(), delta_softplus=True)
        err = {m: max_abs_error(selective_scan(*tensors, delta_bias=bias, delta_softplus=True, method=m), exact)
               for m in ("sequential", "chunked", "logspace")}
        t_seq = time_fn(forward_backward("sequential", tensors, bias), repeats=repeats)
        row = {"L": length, "sequential ms": 1e3 * t_seq,
               "chunked ×": t_seq / time_fn(forward_backward("chunked", tensors, bias), repeats=repeats),
               "logspace ×": t_seq / time_fn(forward_backward("logspace", tensors, bias), repeats=repeats)}
        if length <= indexed_max:
            t_idx = time_fn(forward_backward("indexed", tensors, bias), warmup=0, repeats=2)
            indexed_times.append((length, t_idx))
            row["indexed ×"] = t_seq / t_idx
        row.update({"err sequential": err["sequential"], "err chunked": err["chunked"],
                    "err logspace": err["logspace"]})
        rows.append(row)
    return rows, indexed_times


def chunk_table(length, chunks, repeats):
    tensors, bias = mamba_like_inputs(length)
    t_seq = time_fn(forward_backward("sequential", tensors, bias), repeats=repeats)
    return [{"chunk T": c, "Python steps T + L/T": c + -(-length // c),
             "speed-up over sequential": t_seq / time_fn(forward_backward("chunked", tensors, bias, c), repeats=repeats)}
            for c in chunks]


def overflow_table(length=1024):
    tensors, _ = mamba_like_inputs(length)
    tensors[1] = torch.ones_like(tensors[1])                      # Δ = 1: e^{ΔA} from e^{-1} to e^{-16}
    exact = selective_scan(*[t.double() for t in tensors])
    rows = []
    for method, chunk in (("sequential", None), ("chunked", None), ("logspace", 4), ("logspace", 8),
                          ("logspace", 64)):
        out = selective_scan(*tensors, method=method, chunk=chunk)
        finite = torch.isfinite(out)
        rows.append({"form": method + ("" if chunk is None else f", chunk {chunk}"),
                     "finite outputs": f"{finite.float().mean().item():.1%}",
                     "max error (finite part)": max_abs_error(out[finite], exact[finite])})
    return rows


def rounding_table(lengths=(64, 256, 1024, 4096, 16384)):
    x = torch.rand(max(lengths), generator=torch.Generator().manual_seed(0)).bfloat16()
    rows = []
    for a in (0.875, 0.96875, 0.99609375):                         # 1 − 2^-3, 1 − 2^-5, 1 − 2^-8: exact in bf16
        for dtype in (torch.bfloat16, torch.float32):
            errors, bound = recurrence_rounding(a, x, dtype)
            row = {"a": a, "dtype": str(dtype).removeprefix("torch."), "δ/(1−a)": bound}
            row.update({f"max err ≤ N={n}": errors[:n].max().item() for n in lengths})
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--indexed-max", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunks", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    args = parser.parse_args()
    torch.manual_seed(0)
    rows, indexed = timing_table(args.lengths, args.indexed_max, args.repeats)
    print(f"selective scan, forward + backward, b={B}, d={D}, n={N}: speed-up over the sequential loop "
          f"(threads: {torch.get_num_threads()})")
    print(format_table(rows))
    seq_slope = loglog_slope([r["L"] for r in rows], [r["sequential ms"] for r in rows])
    print(f"\ntime ∝ L^p: sequential p = {seq_slope:.2f}", end="")
    if len(indexed) >= 2:
        print(f", indexed loop p = {loglog_slope(*zip(*indexed)):.2f} (its backward is quadratic)")
    print(f"\n\nchunk size of the chunked scan at L = {max(args.lengths)} (default ⌈√L⌉)")
    print(format_table(chunk_table(max(args.lengths), args.chunks, args.repeats)))
    print("\nstrongly decaying input (Δ = 1, A S4D-real, L = 1024, fp32)")
    print(format_table(overflow_table()))
    print("\nh_t = a h_{t-1} + x_t, x ~ U(0, 1): error against float64 and the bound δ/(1 − a) (δ: largest "
          "rounding of one step, measured)")
    print(format_table(rounding_table()))


if __name__ == "__main__":
    main()
