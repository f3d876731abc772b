"""Differential attention, ablated: is the gain from the subtraction or from the head layout?

A differential layer with h heads has the projection sizes of a standard layer with 2 h heads,
but each differential head reads values of width 2 d, twice a standard head's, and is
normalised on its own (Ye et al. 2025, "Differential Transformer", §2.2). So a comparison of
"differential" against "standard with 2 h heads" changes three things at once: the subtraction,
the number and width of the heads, and the per-head norm. This sweep separates them, on
key-value retrieval among near-duplicate distractors (:func:`attnlab.tasks.key_value_retrieval`
with ``group_size``: the queried key shares its group with ``group_size - 1`` distractors, a
half-match that a second map could learn to subtract):

    standard-4       standard attention, 4 heads of width 16
    standard-2       standard attention, 2 heads of width 32 (the differential layer's head layout)
    diff-zero        differential layer, λ = 0 (one map per head: layout and norm, no subtraction)
    diff-fixed       differential layer, λ frozen at λ_init = 0.2
    diff-learned     differential layer, λ learned (the paper's re-parameterisation)

Every arm is trained at every rate of one learning-rate grid and with the same seeds and
batches. The rate is chosen per arm by the mean validation loss over seeds; results are then
read on a separate test set used for nothing else. Training has a fixed number of steps (no
early stopping). For the differential arms λ is recorded during training.

    python -m attnlab.experiments.diff_ablation --smoke     # seconds: one short point per arm
    python -m attnlab.experiments.diff_ablation             # the full sweep (60 runs, one thread)

The full sweep writes ``attnlab/data/diff_ablation.json`` after every point, and ``--resume``
skips the points already there.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F

from ..bench import format_table
from ..diff_attention import RetrievalModel, attention_on_target, retrieval_loss
from ..tasks import key_value_retrieval
from ..train import train
from . import _sweep

DATA_FILE = "diff_ablation.json"
# arm -> (attention, standard_heads, lambda_mode); the differential arms have 2 heads.
ARMS = {
    "standard-4": ("standard", 4, "learned"),
    "standard-2": ("standard", 2, "learned"),
    "diff-zero": ("differential", None, "zero"),
    "diff-fixed": ("differential", None, "fixed"),
    "diff-learned": ("differential", None, "learned"),
}
LABELS = {
    "standard-4": "standard, 4 heads × 16",
    "standard-2": "standard, 2 heads × 32",
    "diff-zero": "differential, λ = 0",
    "diff-fixed": "differential, λ = λ_init",
    "diff-learned": "differential, λ learned",
}
LRS = (1e-3, 3e-3, 1e-2, 3e-2)
SEEDS = (0, 1, 2)
VAL_SEED, TEST_SEED = 10**6, 2 * 10**6


@dataclass(frozen=True)
class PointConfig:
    """One training run of the sweep."""

    arm: str
    lr: float
    seed: int = 0
    n_pairs: int = 64
    n_keys: int = 128
    n_values: int = 16
    group_size: int = 16
    d_model: int = 64
    n_heads: int = 2          # differential heads
    batch: int = 64
    steps: int = 300
    warmup: int = 20
    record_every: int = 25
    n_val: int = 512
    n_test: int = 1024


def build_model(point: PointConfig) -> RetrievalModel:
    """The arm's model: a :class:`attnlab.diff_attention.RetrievalModel` with near-duplicate keys."""
    if point.arm not in ARMS:
        raise ValueError(f"arm must be one of {tuple(ARMS)}, got {point.arm!r}")
    attention, heads, mode = ARMS[point.arm]
    return RetrievalModel(point.n_keys, point.n_values, point.d_model, point.n_heads, attention,
                          standard_heads=heads, lambda_mode=mode, group_size=point.group_size)


def prompts(point: PointConfig, n: int, seed: int):
    return key_value_retrieval(n, point.n_pairs, n_keys=point.n_keys, n_values=point.n_values,
                               seed=seed, group_size=point.group_size)


def evaluate(model: RetrievalModel, data) -> dict:
    """Accuracy, loss, and the query row's target share and entropy (mean over heads)."""
    model.eval()
    with torch.no_grad():
        logits, rows = model(data.tokens, return_weights=True)
    share, entropy = attention_on_target(rows, data.position)
    return {"accuracy": (logits.argmax(-1) == data.targets).double().mean().item(),
            "loss": F.cross_entropy(logits, data.targets).item(),
            "target_share": share.mean().item(), "best_head_share": share.mean(0).max().item(),
            "entropy": entropy.mean().item()}


def run_point(point: PointConfig) -> dict:
    """Train one model for ``point.steps`` steps and return the JSON-ready record."""
    start = time.perf_counter()
    torch.manual_seed(point.seed)
    model = build_model(point)
    val, test = prompts(point, point.n_val, VAL_SEED), prompts(point, point.n_test, TEST_SEED)
    trajectory = []

    def batch(step):
        data = prompts(point, point.batch, seed=10**5 * (point.seed + 1) + step)
        return data.tokens, data.targets

    def record(m):
        if m.kind == "differential":
            trajectory.append(round(m.attn.lam().item(), 5))
        return {}

    record(model)
    train(model, batch, steps=point.steps, lr=point.lr, warmup=point.warmup, loss_fn=retrieval_loss,
          eval_fn=record, eval_every=point.record_every, seed=point.seed, progress=False)
    out = {**asdict(point), "val": evaluate(model, val), "test": evaluate(model, test),
           "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    if trajectory:
        out["lambda_steps"] = [0] + [min(i * point.record_every, point.steps)
                                     for i in range(1, len(trajectory))]
        out["lambda"] = trajectory
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def sweep_points(arms=tuple(ARMS), lrs=LRS, seeds=SEEDS, **overrides) -> list[PointConfig]:
    return [PointConfig(arm=a, lr=lr, seed=s, **overrides) for a in arms for lr in lrs for s in seeds]


def _key(r) -> tuple:
    if isinstance(r, PointConfig):
        return (r.arm, r.lr, r.seed)
    return (r["arm"], r["lr"], r["seed"])


def run_sweep(points, out: Path | None = None, *, resume: bool = False, progress: bool = True,
              command: str = "") -> dict:
    head = _sweep.header(command, arms=LABELS, lrs=sorted({p.lr for p in points}),
                         seeds=sorted({p.seed for p in points}), selection="lowest mean validation loss",
                         val_seed=VAL_SEED, test_seed=TEST_SEED)
    order = {a: i for i, a in enumerate(ARMS)}
    return _sweep.run_points(points, run_point, key=_key, head=head, out=out, resume=resume, jobs=1,
                             sort=lambda r: (order[r["arm"]], r["lr"], r["seed"]) if isinstance(r, dict)
                             else (order[r.arm], r.lr, r.seed),
                             progress=progress, desc="diff ablation")


def load_sweep(name: str = DATA_FILE) -> dict:
    """The shipped sweep (its header records the command that wrote it)."""
    return _sweep.load_data(name)


def summarise(points: list[dict]) -> list[dict]:
    """One row per arm, in the order of ``ARMS``: the rate with the lowest mean validation loss
    over seeds, and at that rate the test metrics as mean and standard deviation over seeds.
    Test loss is the primary outcome; the target shares use |weights| (see
    :func:`attnlab.diff_attention.attention_on_target`) and are descriptive."""
    by_arm: dict[str, dict[float, list[dict]]] = {}
    for r in points:
        by_arm.setdefault(r["arm"], {}).setdefault(r["lr"], []).append(r)
    rows = []
    for arm in (a for a in ARMS if a in by_arm):
        grid = by_arm[arm]
        best = min(grid, key=lambda lr: sum(r["val"]["loss"] for r in grid[lr]) / len(grid[lr]))
        runs = sorted(grid[best], key=lambda r: r["seed"])
        row = {"arm": arm, "label": LABELS[arm], "best_lr": best, "seeds": [r["seed"] for r in runs]}
        for metric in ("accuracy", "loss", "target_share", "best_head_share", "entropy"):
            values = [r["test"][metric] for r in runs]
            row[metric] = values
            row[metric + "_mean"], row[metric + "_sd"] = _sweep.mean_sd(values)
        if "lambda" in runs[0]:
            row["final_lambda"] = [r["lambda"][-1] for r in runs]
        rows.append(row)
    return rows


def summary(points: list[dict]) -> str:
    rows = [{"arm": r["label"], "lr": r["best_lr"],
             "test loss": f"{r['loss_mean']:.3f} ± {r['loss_sd']:.3f}",
             "test accuracy": f"{r['accuracy_mean']:.3f} ± {r['accuracy_sd']:.3f}",
             "test target share": f"{r['target_share_mean']:.3f} ± {r['target_share_sd']:.3f}",
             "final λ": " ".join(f"{v:.3f}" for v in r.get("final_lambda", [])) or "-"}
            for r in summarise(points)]
    return format_table(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="one short point per arm; writes nothing")
    parser.add_argument("--resume", action="store_true", help="keep the points already in --out")
    parser.add_argument("--steps", type=int, default=PointConfig.steps)
    parser.add_argument("--out", type=Path,
                        default=Path(str(resources.files("attnlab").joinpath("data", DATA_FILE))))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.smoke:
        points = sweep_points(lrs=(1e-2,), seeds=(0,), steps=30, n_val=64, n_test=64)
        print(summary(run_sweep(points, None)["points"]))
        return
    command = "python -m attnlab.experiments.diff_ablation" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]) if a != "--resume")
    points = sweep_points(steps=args.steps)
    result = run_sweep(points, args.out, resume=args.resume, command=command)
    print(summary(result["points"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
