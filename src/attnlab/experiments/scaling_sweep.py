"""A real scaling sweep, small enough for a laptop: loss against model size, fitted with a power law.

Each point trains a two-layer :class:`attnlab.models.MicroGPT` of width ``d_model`` on the
library's character corpus for a fixed number of steps (so a fixed number of training tokens
D) and records its validation and test loss. Every width is tried on the same learning-rate
grid and seeds; the chapter picks each width's rate on the validation split and fits
:math:`L(N) = E + A N^{-\\alpha}` to the test losses, N counting non-embedding parameters as
Kaplan et al. 2020 do.

    python -m attnlab.experiments.scaling_sweep --smoke     # seconds: two tiny points
    python -m attnlab.experiments.scaling_sweep            # the full sweep (60 runs, about 30 min on 1 busy core)

Writes ``attnlab/data/scaling_sweep.json`` after every point; ``--resume`` keeps what is there.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import torch

from ..bench import format_table
from . import _sweep
from ..models import GPTConfig, MicroGPT
from ..train import next_token_loss, train
from .prepost import splits, windows

DATA_FILE = "scaling_sweep.json"
WIDTHS = (8, 16, 32, 64, 128)
LRS = (1e-3, 3e-3, 1e-2, 3e-2)
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class PointConfig:
    """One training run of the scaling sweep."""

    d_model: int
    lr: float
    seed: int = 0
    n_layers: int = 2
    n_heads: int = 2
    batch: int = 16
    seq_len: int = 32
    steps: int = 400
    warmup: int = 30
    eval_windows: int = 128

    @property
    def tokens(self) -> int:
        """Training tokens D seen by the run."""
        return self.steps * self.batch * self.seq_len


def build_model(point: PointConfig, vocab: int) -> MicroGPT:
    return MicroGPT(GPTConfig(vocab_size=vocab, max_len=point.seq_len, n_layers=point.n_layers,
                              d_model=point.d_model, n_heads=point.n_heads))


def non_embedding_parameters(model: MicroGPT) -> int:
    """Kaplan et al.'s N: every parameter except the token and position embeddings (the head is tied)."""
    embedding = {id(model.tok_emb.weight), id(model.pos_emb.weight)}
    return sum(p.numel() for p in model.parameters() if id(p) not in embedding)


def run_point(point: PointConfig, *, progress: bool = False) -> dict:
    """Train one model; return its sizes and its validation and test losses (a JSON-ready dict)."""
    data = splits()
    torch.manual_seed(point.seed)
    model = build_model(point, data["vocab"])
    val = windows(data["val"], point.eval_windows, point.seq_len, seed=1)
    test = windows(data["test"], point.eval_windows, point.seq_len, seed=2)
    g = torch.Generator().manual_seed(20_011 + point.seed)

    def batch_fn(step):
        return windows(data["train"], point.batch, point.seq_len, seed=int(torch.randint(2**62, (1,), generator=g)))

    start = time.perf_counter()
    history = train(model, batch_fn, steps=point.steps, lr=point.lr, warmup=point.warmup, seed=point.seed,
                    eval_fn=lambda m: {"val": next_token_loss(m, *val).item(), "test": next_token_loss(m, *test).item()},
                    progress=progress, description=f"d={point.d_model}")
    last = history.evals[-1]
    return {**asdict(point), "parameters": sum(p.numel() for p in model.parameters()),
            "non_embedding_parameters": non_embedding_parameters(model), "tokens": point.tokens,
            "val_loss": round(last["val"], 4), "test_loss": round(last["test"], 4),
            "final_train_loss": round(sum(history.loss[-20:]) / 20, 4),
            "loss": [round(v, 4) for v in history.loss],
            "seconds": round(time.perf_counter() - start, 1)}


def sweep_points(widths=WIDTHS, lrs=LRS, seeds=SEEDS, **overrides) -> list[PointConfig]:
    return [PointConfig(d_model=d, lr=lr, seed=s, **overrides) for d in widths for lr in lrs for s in seeds]


def _key(r) -> tuple:
    return (r.d_model, r.lr, r.seed) if isinstance(r, PointConfig) else (r["d_model"], r["lr"], r["seed"])


def run_sweep(points: list[PointConfig], out: Path | None = None, *, jobs: int = 1, resume: bool = False,
              progress: bool = True, command: str = "") -> dict:
    """Run every point (``jobs`` processes of one thread each), writing ``out`` after each one."""
    head = _sweep.header(command, seeds=sorted({p.seed for p in points}))
    return _sweep.run_points(points, run_point, key=_key, head=head, out=out, resume=resume, jobs=jobs,
                             order=lambda p: -p.d_model, progress=progress, desc="scaling sweep")


def load_sweep(name: str = DATA_FILE) -> dict:
    """The precomputed sweep shipped in ``attnlab/data/``."""
    return _sweep.load_data(name)


def summarise(points: list[dict]) -> list[dict]:
    """One row per width: the rate with the lowest mean validation loss, and at that rate the
    test loss as mean and standard deviation over seeds."""
    widths: dict[int, dict[float, list[dict]]] = {}
    for r in points:
        widths.setdefault(r["d_model"], {}).setdefault(r["lr"], []).append(r)
    rows = []
    for d in sorted(widths):
        by_lr = widths[d]
        best = min(by_lr, key=lambda lr: sum(r["val_loss"] for r in by_lr[lr]) / len(by_lr[lr]))
        mean, sd = _sweep.mean_sd([r["test_loss"] for r in by_lr[best]])
        rows.append({"d_model": d, "N": by_lr[best][0]["non_embedding_parameters"], "best_lr": best,
                     "seeds": len(by_lr[best]), "test_mean": mean, "test_sd": sd})
    return rows


def fit_power_law(n, loss, *, irreducible: bool = True, grid: int = 4000) -> dict:
    r"""Least-squares fit of :math:`L = E + A N^{-\alpha}` in log space.

    For each candidate E on a grid in [0, min L), log(L − E) is linear in log N with slope −α;
    the E whose fitted curve has the smallest squared error in log L wins. With
    ``irreducible=False``, E = 0 and the fit is Kaplan's form :math:`(N_c/N)^{\alpha}`, with
    :math:`N_c = A^{1/\alpha}`. Returns {"E", "A", "alpha", "N_c", "rmse"} (rmse in log L).
    """
    n = torch.as_tensor(n, dtype=torch.float64)
    loss = torch.as_tensor(loss, dtype=torch.float64)
    if n.shape != loss.shape or n.dim() != 1 or len(n) < 3:
        raise ValueError(f"fit_power_law needs n and loss of one shape (k,), k >= 3; got {tuple(n.shape)}, "
                         f"{tuple(loss.shape)}")
    if not bool((n > 0).all() and (loss > 0).all()):
        raise ValueError("fit_power_law: n and loss must be positive")
    log_n = n.log()

    def fit(e):
        y = (loss - e).log()
        slope, intercept = torch.linalg.lstsq(torch.stack([log_n, torch.ones_like(log_n)], 1), y[:, None]).solution[:, 0]
        predicted = e + intercept.exp() * (log_n * slope).exp()
        return float((predicted.log() - loss.log()).square().mean()), -float(slope), float(intercept.exp())

    candidates = [0.0] if not irreducible else (loss.min() * torch.linspace(0, 1, grid + 1)[:-1]).tolist()
    e = min(candidates, key=lambda c: fit(c)[0])
    if irreducible:                       # refine between the neighbours by golden-section search
        step = float(loss.min()) / grid
        lo, hi = max(e - step, 0.0), min(e + step, float(loss.min()) * (1 - 1e-12))
        for _ in range(60):
            a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
            lo, hi = (lo, b) if fit(a)[0] < fit(b)[0] else (a, hi)
        e = (lo + hi) / 2
    mse, alpha, a = fit(e)
    return {"E": e, "A": a, "alpha": alpha, "N_c": a ** (1 / alpha), "rmse": math.sqrt(mse)}


SMOKE = dict(widths=(8, 16), lrs=(1e-2,), seeds=(0,), steps=60, warmup=10, eval_windows=32)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="two tiny points; writes nothing")
    parser.add_argument("--jobs", type=int, default=1, help="processes (one torch thread each)")
    parser.add_argument("--resume", action="store_true", help="keep the points already in --out")
    parser.add_argument("--out", type=Path, default=Path(str(resources.files("attnlab").joinpath("data", DATA_FILE))))
    args = parser.parse_args(argv)
    if args.smoke:
        options = dict(SMOKE)
        grid = {k: options.pop(k) for k in ("widths", "lrs", "seeds")}
        points = run_sweep(sweep_points(**grid, **options), None, jobs=args.jobs)["points"]
        print(format_table(summarise(points)))
        return
    command = "python -m attnlab.experiments.scaling_sweep" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    result = run_sweep(sweep_points(), args.out, jobs=args.jobs, resume=args.resume, command=command)
    rows = summarise(result["points"])
    print(format_table(rows, floatfmt=".4g"))
    fit = fit_power_law([r["N"] for r in rows], [r["test_mean"] for r in rows])
    print("fit: L = {E:.3f} + {A:.3g} N^-{alpha:.3f}".format(**fit))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
