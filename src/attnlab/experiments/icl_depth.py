"""In-context regression: trained linear-attention stacks of depth 1, 2, 3 against gradient descent.

Each :class:`attnlab.icl.LinearSelfAttentionStack` (K layers, random start at scale 0.01) is
trained on fresh regression prompts (d = 5, N = 20, noiseless, batch 128, MSE on the query)
at every rate of one grid and with three seeds. The rate is chosen per depth by the mean
validation MSE over seeds (2,048 prompts); the test MSE is read on the 4,096 prompts that
chapter 6 uses for its gradient-descent baselines (seed 10**6), used for nothing else.

    python -m attnlab.experiments.icl_depth --smoke   # seconds: one short point per depth
    python -m attnlab.experiments.icl_depth           # the full sweep (36 runs, one thread)
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass

import torch

from ..icl import LinearSelfAttentionStack, prompt_tokens
from ..tasks import in_context_regression
from ..train import train
from . import _sweep

DATA_FILE = "icl_depth.json"
DEPTHS = (1, 2, 3)
LRS = (3e-3, 1e-2, 3e-2, 1e-1)
SEEDS = (0, 1, 2)
VAL_SEED, TEST_SEED = 2 * 10**6, 10**6


@dataclass(frozen=True)
class PointConfig:
    """One training run: depth, rate, seed."""

    layers: int
    lr: float
    seed: int = 0
    d: int = 5
    n_ctx: int = 20
    batch: int = 128
    steps: int = 300
    warmup: int = 20
    n_val: int = 2048
    n_test: int = 4096


def _mse(model, prompts) -> float:
    with torch.no_grad():
        return (model(prompt_tokens(prompts)) - prompts.y_test).square().mean().item()


def run_point(point: PointConfig) -> dict:
    """Train one stack for ``point.steps`` steps; its validation and test MSE."""
    start = time.perf_counter()
    torch.manual_seed(point.seed)
    model = LinearSelfAttentionStack(point.d, n_layers=point.layers)

    def batch(step):
        p = in_context_regression(point.batch, point.n_ctx, point.d,
                                  seed=10**5 * (point.seed + 1) + step, dtype=torch.float32)
        return prompt_tokens(p), p.y_test

    def squared_error(m, tokens, y):
        return (m(tokens) - y).square().mean()

    train(model, batch, steps=point.steps, lr=point.lr, warmup=point.warmup,
          loss_fn=squared_error, seed=point.seed, progress=False)
    val = in_context_regression(point.n_val, point.n_ctx, point.d, seed=VAL_SEED,
                                dtype=torch.float32)
    test = in_context_regression(point.n_test, point.n_ctx, point.d, seed=TEST_SEED,
                                 dtype=torch.float32)
    return {**asdict(point), "val_mse": _mse(model, val), "test_mse": _mse(model, test),
            "seconds": round(time.perf_counter() - start, 1)}


def _key(r) -> tuple:
    if isinstance(r, PointConfig):
        return (r.layers, r.lr, r.seed)
    return (r["layers"], r["lr"], r["seed"])


def summarise(points: list[dict]) -> dict[int, dict]:
    """Per depth: the rate with the lowest mean validation MSE, and the test MSE per seed there."""
    out = {}
    for k in sorted({r["layers"] for r in points}):
        grid: dict[float, list[dict]] = {}
        for r in points:
            if r["layers"] == k:
                grid.setdefault(r["lr"], []).append(r)
        def val(lr):                       # a diverged run (nan or inf) loses
            v = sum(r["val_mse"] for r in grid[lr]) / len(grid[lr])
            return v if math.isfinite(v) else math.inf

        best = min(grid, key=val)
        runs = sorted(grid[best], key=lambda r: r["seed"])
        out[k] = {"best_lr": best, "seeds": [r["seed"] for r in runs],
                  "test_mse": [r["test_mse"] for r in runs],
                  "val_by_lr": {lr: sum(r["val_mse"] for r in v) / len(v)
                                for lr, v in sorted(grid.items())}}
    return out


def load_sweep(name: str = DATA_FILE) -> dict:
    """The shipped sweep (its header records the command that wrote it)."""
    return _sweep.load_data(name)


def main(argv=None) -> None:
    args = _sweep.sweep_args(__doc__.split("\n\n")[0], DATA_FILE, argv)
    if args.smoke:
        points = [PointConfig(k, 1e-2, steps=20, n_val=64, n_test=64) for k in DEPTHS]
    else:
        points = [PointConfig(k, lr, s) for k in DEPTHS for lr in LRS for s in SEEDS]
    command = "python -m attnlab.experiments.icl_depth" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]) if a != "--resume")
    head = _sweep.header(command, depths=list(DEPTHS), lrs=list(LRS), seeds=list(SEEDS),
                         selection="lowest mean validation MSE", val_seed=VAL_SEED,
                         test_seed=TEST_SEED)
    result = _sweep.run_points(points, run_point, key=_key, head=head,
                               out=None if args.smoke else args.out, resume=args.resume,
                               progress=False, desc="icl depth")
    for k, row in summarise(result["points"]).items():
        print(k, row)
    if not args.smoke:
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
