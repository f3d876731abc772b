"""Pre-LN against post-LN in training: depth, learning rate and warmup, measured.

Each point of the sweep trains a small character-level language model on the library's text
corpus (:func:`attnlab.tasks.char_corpus`, the pydoc help pages that ship with Python) and
records its training-loss curve, the gradient norm of every block at a few steps (most of
them early, where post-LN's trouble starts), validation and test loss, and whether it
diverged. The design follows Xiong et al. 2020 ("On Layer Normalization in the Transformer
Architecture": pre- against post-LN, with and without warmup), Liu et al. 2020 ("Understanding
the Difficulty of Training Transformers": post-LN's dependence on its residual branches) and
Wang et al. 2022 ("DeepNet": post-LN diverges as depth grows).

The arms are {pre-LN, post-LN} × depth {6, 24} × {warmup, no warmup}, every arm on the same
learning-rate grid and the same seeds. Adam, no gradient clipping (clipping is a second
remedy; the sweep isolates warmup), PyTorch's default initialisation of every linear layer,
unit-variance token embeddings plus the sinusoidal position table, as in Vaswani et al. 2017.

    python -m attnlab.experiments.prepost --smoke          # seconds: a few short points
    python -m attnlab.experiments.prepost --jobs 2         # the full sweep (72 runs, ~2.7 core-hours)

The full sweep writes ``attnlab/data/prepost_sweep.json`` after every point, and ``--resume``
skips the points already there.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..bench import format_table
from . import _sweep
from ..blocks import LayerNorm, TransformerBlock
from ..positional import sinusoidal_encoding
from ..schedules import warmup_cosine_lr
from ..tasks import char_corpus

DATA_FILE = "prepost_sweep.json"
NORMS = ("pre", "post")
DEPTHS = (6, 24)
WARMUPS = (0, 30)                 # no warmup, and a linear warmup over the first 30 steps
LRS = (1e-3, 3e-3, 1e-2)
SEEDS = (0, 1, 2)
# Steps at which every block's gradient norm is recorded (dense early, where warmup acts).
GRAD_STEPS = (1, 2, 3, 5, 8, 12, 20, 30, 50, 80, 120, 160, 200)


@dataclass(frozen=True)
class PointConfig:
    """One training run of the sweep."""

    norm_position: str
    n_layers: int
    warmup: int
    lr: float
    seed: int = 0
    d_model: int = 64
    n_heads: int = 4
    batch: int = 16
    seq_len: int = 32
    steps: int = 200
    eval_every: int = 50
    eval_windows: int = 64
    betas: tuple[float, float] = (0.9, 0.98)

    @property
    def arm(self) -> str:
        """The arm this point belongs to (everything but the learning rate and the seed)."""
        return arm_name(self.norm_position, self.n_layers, self.warmup)


def arm_name(norm_position: str, n_layers: int, warmup: int) -> str:
    return f"{norm_position}-LN, {n_layers} layers, " + (f"warmup {warmup}" if warmup else "no warmup")


class CharTransformer(nn.Module):
    r"""A decoder-only character model whose blocks are pre-LN or post-LN.

    .. math:: x_0 = E[\text{idx}] + PE, \quad x_\ell = \mathrm{Block}_\ell(x_{\ell-1}), \quad
              \text{logits} = W_U\,\mathrm{LN}_f(x_L) \;(\text{pre-LN}) \text{ or } W_U\,x_L \;(\text{post-LN})

    The token embedding has unit variance (the Transformer's √d-scaled embedding), positions
    are the fixed sinusoidal table, and every linear layer keeps PyTorch's default
    initialisation. A pre-LN stack needs the final LayerNorm; a post-LN stack already ends
    with one. Shapes: idx (b, L) -> logits (b, L, vocab).
    """

    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int, norm_position: str,
                 max_len: int = 256):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)                      # N(0, 1) by default
        self.register_buffer("positions", sinusoidal_encoding(max_len, d_model), persistent=False)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, n_heads, norm_position=norm_position)
                                    for _ in range(n_layers))
        self.norm_f = LayerNorm(d_model) if norm_position == "pre" else nn.Identity()
        self.head = nn.Linear(d_model, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.positions[: idx.shape[1]]
        for block in self.blocks:
            x = block(x, causal=True)
        return self.head(self.norm_f(x))


def build_model(point: PointConfig, vocab: int) -> CharTransformer:
    if point.norm_position not in NORMS:
        raise ValueError(f"norm_position must be one of {NORMS}, got {point.norm_position!r}")
    return CharTransformer(vocab, point.d_model, point.n_layers, point.n_heads, point.norm_position,
                           max_len=point.seq_len)


@lru_cache(maxsize=1)
def splits() -> dict:
    """The corpus as id tensors: train (the first 90 %), then validation and test (5 % each)."""
    corpus = char_corpus()
    half = len(corpus.val_ids) // 2
    counts = torch.bincount(corpus.train_ids, minlength=corpus.vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return {"vocab": corpus.vocab_size, "train": corpus.train_ids, "val": corpus.val_ids[:half],
            "test": corpus.val_ids[half:], "unigram_entropy": float(-(p * p.log()).sum())}


def windows(ids: torch.Tensor, n: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n random windows of ``ids`` (seeded): inputs (n, length) and next-character targets (n, length)."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - length - 1, (n,), generator=g)
    w = torch.stack([ids[s:s + length + 1] for s in starts.tolist()])
    return w[:, :-1], w[:, 1:]


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def grad_norm(params) -> float:
    """‖g‖ over the gradients of ``params`` taken together (one number)."""
    grads = [p.grad for p in params if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))) if grads else 0.0


def block_grad_norms(model: CharTransformer) -> list[float]:
    """‖∂loss/∂θ_ℓ‖ over all parameters θ_ℓ of each block ℓ, bottom to top."""
    return [grad_norm(b.parameters()) for b in model.blocks]


def _finite(v: float) -> float | None:
    return round(v, 4) if math.isfinite(v) else None


def _significant(v: float) -> float | None:
    """Four significant digits: gradient norms span many orders of magnitude."""
    return float(f"{v:.4g}") if math.isfinite(v) else None


def run_point(point: PointConfig, *, progress: bool = False) -> dict:
    """Train one model and return what the sweep records (a JSON-ready dict).

    A run stops at the first non-finite loss. It counts as diverged if that happens, or if
    its training loss over the last 20 steps averages above its loss at step 1.
    """
    data = splits()
    torch.manual_seed(point.seed)
    model = build_model(point, data["vocab"])
    optimizer = torch.optim.Adam(model.parameters(), lr=point.lr, betas=point.betas)
    val = windows(data["val"], point.eval_windows, point.seq_len, seed=1)
    test = windows(data["test"], point.eval_windows, point.seq_len, seed=2)
    g = torch.Generator().manual_seed(10_007 + point.seed)      # the batches: the same for every arm

    def evaluate(split):
        model.eval()
        with torch.no_grad():
            value = lm_loss(model, *split).item()
        model.train()
        return value

    losses, totals, grads, evals = [], [], {}, []
    nonfinite_at = None
    start = time.perf_counter()
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=point.steps, desc=point.arm, leave=False)
    model.train()
    for step in range(1, point.steps + 1):
        lr = warmup_cosine_lr(step, peak=point.lr, warmup=point.warmup, total=point.steps, final=0.1 * point.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = windows(data["train"], point.batch, point.seq_len, seed=int(torch.randint(2**62, (1,), generator=g)))
        loss = lm_loss(model, x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        total = grad_norm(model.parameters())
        losses.append(loss.item())
        totals.append(total)
        if step in GRAD_STEPS:
            grads[str(step)] = [_significant(v) for v in block_grad_norms(model)]
        if not (math.isfinite(loss.item()) and math.isfinite(total)):
            nonfinite_at = step
            break
        optimizer.step()
        if step % point.eval_every == 0:
            evals.append({"step": step, "val": _finite(evaluate(val))})
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    final_train = sum(losses[-20:]) / len(losses[-20:])
    val_loss = evaluate(val) if nonfinite_at is None else float("nan")
    test_loss = evaluate(test) if nonfinite_at is None else float("nan")
    diverged = nonfinite_at is not None or not math.isfinite(val_loss) or final_train > losses[0]
    return {**asdict(point), "arm": point.arm, "parameters": sum(p.numel() for p in model.parameters()),
            "diverged": bool(diverged), "nonfinite_at": nonfinite_at,
            "initial_loss": _finite(losses[0]), "final_train_loss": _finite(final_train),
            "val_loss": _finite(val_loss), "test_loss": _finite(test_loss),
            "loss": [_finite(v) for v in losses], "grad_norm": [_significant(v) for v in totals],
            "block_grad_norms": grads, "evals": evals, "seconds": round(time.perf_counter() - start, 1)}


def sweep_points(norms=NORMS, depths=DEPTHS, warmups=WARMUPS, lrs=LRS, seeds=SEEDS, **overrides) -> list[PointConfig]:
    """The grid: every arm at every learning rate and seed (other settings from ``overrides``)."""
    return [PointConfig(norm_position=n, n_layers=L, warmup=w, lr=lr, seed=s, **overrides)
            for n in norms for L in depths for w in warmups for lr in lrs for s in seeds]


def _key(r) -> tuple:
    if isinstance(r, PointConfig):
        return (r.norm_position, r.n_layers, r.warmup, r.lr, r.seed)
    return (r["norm_position"], r["n_layers"], r["warmup"], r["lr"], r["seed"])


def run_sweep(points: list[PointConfig], out: Path | None = None, *, jobs: int = 1, resume: bool = False,
              progress: bool = True, command: str = "") -> dict:
    """Run every point (``jobs`` processes of one thread each), writing ``out`` after each one."""
    head = _sweep.header(command, seeds=sorted({p.seed for p in points}),
                         unigram_entropy=round(splits()["unigram_entropy"], 4))
    return _sweep.run_points(points, run_point, key=_key, head=head, out=out, resume=resume, jobs=jobs,
                             order=lambda p: -p.n_layers,   # longest first
                             progress=progress, desc="pre/post-LN sweep")


def load_sweep(name: str = DATA_FILE) -> dict:
    """The precomputed sweep shipped in ``attnlab/data/`` (its header records the command that wrote it)."""
    return _sweep.load_data(name)


def summarise(points: list[dict]) -> list[dict]:
    """One row per arm: the learning rate with the lowest mean validation loss over seeds (a
    diverged seed counts as +∞), and at that rate the test loss as mean ± standard deviation over
    seeds, with the number of diverged runs at every rate of the grid."""
    arms: dict[str, dict[float, list[dict]]] = {}
    for r in points:
        arms.setdefault(r["arm"], {}).setdefault(r["lr"], []).append(r)
    rows = []
    for arm, by_lr in arms.items():
        def score(lr):
            vals = [r["val_loss"] if r["val_loss"] is not None and not r["diverged"] else math.inf
                    for r in by_lr[lr]]
            return sum(vals) / len(vals)

        best = min(by_lr, key=score)
        runs = by_lr[best]
        ok = [r["test_loss"] for r in runs if not r["diverged"]]
        mean, sd = _sweep.mean_sd(ok) if ok else (math.nan, math.nan)
        first = runs[0]
        rows.append({"arm": arm, "norm_position": first["norm_position"], "n_layers": first["n_layers"],
                     "warmup": first["warmup"], "best_lr": best, "seeds": len(runs),
                     "test_mean": mean, "test_sd": sd, "val_mean": score(best),
                     "diverged": {lr: sum(r["diverged"] for r in by_lr[lr]) for lr in sorted(by_lr)}})
    order = {n: i for i, n in enumerate(NORMS)}
    rows.sort(key=lambda r: (r["n_layers"], order[r["norm_position"]], -r["warmup"]))
    return rows


def summary(points: list[dict]) -> str:
    rows = [{"arm": r["arm"], "best lr": r["best_lr"], "test loss": f"{r['test_mean']:.3f} ± {r['test_sd']:.3f}",
             "diverged per lr": " ".join(f"{lr:g}:{n}" for lr, n in r["diverged"].items())}
            for r in summarise(points)]
    return format_table(rows)


# The notebook's live run: one seed, depth 6, a short run at the largest rate of the grid.
SMOKE = dict(depths=(6,), lrs=(1e-2,), seeds=(0,), steps=40, eval_every=20, eval_windows=16)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a few short points; writes nothing")
    parser.add_argument("--jobs", type=int, default=1, help="processes (one torch thread each)")
    parser.add_argument("--resume", action="store_true", help="keep the points already in --out")
    parser.add_argument("--steps", type=int, default=PointConfig.steps)
    parser.add_argument("--out", type=Path, default=Path(str(resources.files("attnlab").joinpath("data", DATA_FILE))))
    args = parser.parse_args(argv)
    if args.smoke:
        options = dict(SMOKE)
        grid = {k: options.pop(k) for k in ("depths", "lrs", "seeds")}
        points = sweep_points(**grid, **options)
        print(summary(run_sweep(points, None, jobs=args.jobs)["points"]))
        return
    command = "python -m attnlab.experiments.prepost" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    points = sweep_points(steps=args.steps)
    result = run_sweep(points, args.out, jobs=args.jobs, resume=args.resume, command=command)
    print(summary(result["points"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
