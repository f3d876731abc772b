"""Length generalisation: five ways of telling a small Transformer about position, trained on
sequences of at most 32 tokens and tested at 32, 64 and 128.

The task is *repeat a random segment*: a start token, a segment of distinct random tokens
x_1 … x_L, then the same segment again; the model is scored on predicting x_2 … x_L of the
repeat (the first token of the repeat cannot be known). A sequence is 2L tokens long. Training draws L from 4 … 16 afresh for every batch, so
no fixed offset solves it: the model has to learn the length-free algorithm, an *induction
head* (a first-layer head that copies each token's predecessor into it, a second-layer head
that finds the earlier copy of the current token and reads what followed it). Both heads
need position: the first must find "the token just before me". Whether a model still runs
that algorithm at 2× and 4× the longest training sequence is what the positional scheme
decides.

Each point trains :class:`attnlab.position_models.PositionLM` (2 layers, d_model = 64, 4
heads) with one scheme, one learning rate and one seed, for a fixed number of steps (no
early stopping), and records its accuracy on a validation set at the training length
(used only to choose each scheme's learning rate) and on fresh test sets at 1×, 2× and 4×.

    python -m attnlab.experiments.positions --smoke        # one short run per scheme
    python -m attnlab.experiments.positions --jobs 2       # the full sweep: 45 runs, about 25 CPU-minutes

The full sweep writes ``attnlab/data/positions_sweep.json`` after every run, and
``--resume`` skips the runs already there.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path

import torch

from ..bench import format_table
from . import _sweep
from ..position_models import SCHEMES, PositionConfig, PositionLM
from ..train import train

LEARNING_RATES = (1e-3, 3e-3, 1e-2)
SEEDS = (0, 1, 2)
TEST_FACTORS = (1, 2, 4)
DATA_FILE = "positions_sweep.json"
VALIDATION_SEED, TEST_SEED = 10_000_019, 20_000_003


BOS = 0    # token 0 opens every sequence; the segment's tokens are 1 … vocab − 1


@dataclass
class RepeatBatch:
    """A start token, a segment of distinct tokens, and the segment again, cut to an even length.

    ``inputs`` (b, 2L) is BOS x_1 … x_L x_1 … x_{L−1}; ``targets`` (b, 2L) is −100 except at
    the L − 1 positions of the repeat, which must predict x_2 … x_L.
    """

    inputs: torch.Tensor
    targets: torch.Tensor

    @property
    def scored(self) -> torch.Tensor:
        """(b, 2L) bool: the positions whose next token is scored."""
        return self.targets != -100


def repeat_task(batch: int, segment: int, *, vocab: int = 128, seed: int = 0) -> RepeatBatch:
    """``batch`` sequences of length 2 · ``segment``: BOS, ``segment`` distinct random tokens
    (from 1 … vocab − 1), then the same tokens again (all but the last, which is the final target)."""
    if not 2 <= segment < vocab:
        raise ValueError(f"segment must be between 2 and vocab - 1 = {vocab - 1}, got {segment}")
    if batch < 1:
        raise ValueError(f"batch must be positive, got {batch}")
    g = torch.Generator().manual_seed(seed)
    x = 1 + torch.rand(batch, vocab - 1, generator=g).argsort(-1)[:, :segment]    # distinct in each row
    bos = torch.full((batch, 1), BOS)
    inputs = torch.cat([bos, x, x[:, :-1]], dim=1)
    targets = torch.full_like(inputs, -100)
    targets[:, segment + 1:] = x[:, 1:]          # the repeat's x_1 … x_{L−1} predict x_2 … x_L
    return RepeatBatch(inputs, targets)


@dataclass(frozen=True)
class PointConfig:
    """One training run of the sweep: a scheme, a learning rate, a seed, and the fixed rest."""

    scheme: str
    lr: float
    seed: int = 0
    vocab: int = 128
    min_segment: int = 4
    max_segment: int = 16          # the longest training sequence is 2 · 16 = 32 tokens
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    batch: int = 32
    steps: int = 1000
    warmup: int = 50
    eval_every: int = 100
    eval_size: int = 256
    test_size: int = 256

    @property
    def train_len(self) -> int:
        return 2 * self.max_segment

    @property
    def test_lengths(self) -> tuple[int, ...]:
        return tuple(f * self.train_len for f in TEST_FACTORS)

    def model_config(self) -> PositionConfig:
        """The model: a learned table is sized for the longest test (4× the training length)."""
        return PositionConfig(vocab=self.vocab, scheme=self.scheme, d_model=self.d_model,
                              n_heads=self.n_heads, n_layers=self.n_layers, max_len=max(self.test_lengths))


def build_model(point: PointConfig) -> PositionLM:
    return PositionLM(point.model_config())


@torch.no_grad()
def repeat_accuracy(model: torch.nn.Module, batch: RepeatBatch) -> float:
    """Fraction of scored positions where the most likely next token is the right one."""
    predictions = model(batch.inputs).argmax(-1)
    return (predictions[batch.scored] == batch.targets[batch.scored]).float().mean().item()


def training_batch(point: PointConfig, step: int) -> RepeatBatch:
    """The batch of ``step``: one segment length for the batch, drawn from min … max_segment."""
    seed = point.seed * 1_000_003 + step
    g = torch.Generator().manual_seed(seed)
    segment = int(torch.randint(point.min_segment, point.max_segment + 1, (1,), generator=g))
    return repeat_task(point.batch, segment, vocab=point.vocab, seed=seed)


def evaluation_sets(point: PointConfig) -> tuple[RepeatBatch, dict[int, RepeatBatch]]:
    """The validation set (training length; chooses learning rates) and a fresh test set per length."""
    validation = repeat_task(point.eval_size, point.max_segment, vocab=point.vocab, seed=VALIDATION_SEED)
    tests = {n: repeat_task(point.test_size, n // 2, vocab=point.vocab, seed=TEST_SEED + n)
             for n in point.test_lengths}
    return validation, tests


def run_point(point: PointConfig, *, progress: bool = False, return_model: bool = False):
    """Train one model and return what the sweep records (a JSON-ready dict), and the model if asked."""
    torch.manual_seed(point.seed)
    model = build_model(point)
    validation, tests = evaluation_sets(point)

    def batch_fn(step: int):
        b = training_batch(point, step)
        return b.inputs, b.targets

    start, cpu_start = time.perf_counter(), time.process_time()
    history = train(model, batch_fn, steps=point.steps, lr=point.lr, warmup=point.warmup,
                    eval_fn=lambda m: {"accuracy": repeat_accuracy(m, validation)},
                    eval_every=point.eval_every, seed=point.seed, progress=progress,
                    description=f"{point.scheme} lr={point.lr:g} seed={point.seed}")
    steps, accuracy = history.eval_series("accuracy")
    result = {**asdict(point), "parameters": sum(p.numel() for p in model.parameters()),
              "val_accuracy": round(accuracy[-1], 4),
              "test_accuracy": {str(n): round(repeat_accuracy(model, b), 4) for n, b in tests.items()},
              "final_loss": round(sum(history.loss[-20:]) / len(history.loss[-20:]), 4),
              "curve": {"step": steps, "accuracy": [round(a, 4) for a in accuracy]}}
    if point.scheme == "learned":                    # rows past the training length never get a gradient
        norms = model.pos_emb.weight.detach().norm(dim=-1)
        result["row_norm"] = {"trained": round(norms[:point.train_len].mean().item(), 4),
                              "untrained": round(norms[point.train_len:].mean().item(), 4)}
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["cpu_seconds"] = round(time.process_time() - cpu_start, 1)
    return (result, model) if return_model else result


def sweep_points(schemes=SCHEMES, lrs=LEARNING_RATES, seeds=SEEDS, **overrides) -> list[PointConfig]:
    """The grid: every scheme at every learning rate and seed (other settings from ``overrides``)."""
    return [PointConfig(scheme=s, lr=lr, seed=seed, **overrides) for seed in seeds for s in schemes for lr in lrs]


def _key(r) -> tuple:
    return (r["scheme"], r["lr"], r["seed"]) if isinstance(r, dict) else (r.scheme, r.lr, r.seed)


def run_sweep(points: list[PointConfig], out: Path | None = None, *, jobs: int = 1, resume: bool = False,
              progress: bool = True, command: str = "") -> dict:
    """Run every point (``jobs`` processes of one thread each), writing ``out`` after each one."""
    head = _sweep.header(command, seeds=sorted({p.seed for p in points}),
                         learning_rates=sorted({p.lr for p in points}))
    return _sweep.run_points(points, run_point, key=_key, head=head, out=out, resume=resume, jobs=jobs,
                             sort=lambda r: (SCHEMES.index(r["scheme"]), r["lr"], r["seed"]),
                             indent=1, progress=progress, desc="positions sweep")


def load_sweep(name: str = DATA_FILE) -> dict:
    """The precomputed sweep shipped in ``attnlab/data/`` (its header records the command that wrote it)."""
    return _sweep.load_data(name)


def best_learning_rates(points: list[dict]) -> dict[str, float]:
    """Each scheme's learning rate with the highest mean *validation* accuracy over seeds (ties: the smaller rate)."""
    best = {}
    for scheme in dict.fromkeys(r["scheme"] for r in points):
        by_lr: dict[float, list[float]] = {}
        for r in points:
            if r["scheme"] == scheme:
                by_lr.setdefault(r["lr"], []).append(r["val_accuracy"])
        best[scheme] = max(sorted(by_lr), key=lambda lr: statistics.fmean(by_lr[lr]))
    return best


def summarise(points: list[dict]) -> list[dict]:
    """One row per scheme at its chosen rate: test accuracy mean, std, min and max over seeds per length."""
    rows = []
    for scheme, lr in best_learning_rates(points).items():
        runs = [r for r in points if r["scheme"] == scheme and r["lr"] == lr]
        row = {"scheme": scheme, "lr": lr, "seeds": len(runs)}
        for n in runs[0]["test_accuracy"]:
            accs = [r["test_accuracy"][n] for r in runs]
            row[n] = {"mean": statistics.fmean(accs), "std": statistics.pstdev(accs),
                      "min": min(accs), "max": max(accs)}
        rows.append(row)
    return rows


def summary_table(points: list[dict]) -> str:
    """The summary as text: mean±std (min–max) over seeds of the test accuracy, per scheme and length."""
    rows = []
    for row in summarise(points):
        cells = {"scheme": row["scheme"], "lr": f"{row['lr']:g}"}
        for n, s in row.items():
            if isinstance(s, dict):
                cells[f"n = {n}"] = f"{s['mean']:.2f}±{s['std']:.2f} ({s['min']:.2f}–{s['max']:.2f})"
        rows.append(cells)
    return format_table(rows)


def point_from_record(r: dict) -> PointConfig:
    """The configuration a recorded run was made with."""
    return PointConfig(**{f.name: r[f.name] for f in fields(PointConfig)})


# The notebook's live run: one seed, 400 of the 1,000 steps, each scheme at the rate the sweep chose.
SMOKE = dict(steps=400, eval_every=100, eval_size=128, test_size=128)


def chosen_rates(default: float = 1e-2) -> dict[str, float]:
    """Each scheme's learning rate in the shipped sweep (``default`` for a scheme it lacks)."""
    try:
        chosen = best_learning_rates(load_sweep()["points"])
    except FileNotFoundError:
        chosen = {}
    return {s: chosen.get(s, default) for s in SCHEMES}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true",
                        help="one short run per scheme at the shipped sweep's rates; writes nothing")
    parser.add_argument("--jobs", type=int, default=1, help="processes (one torch thread each)")
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --out")
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    parser.add_argument("--lrs", nargs="+", type=float, default=list(LEARNING_RATES), help="learning-rate grid")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--steps", type=int, default=PointConfig.steps, help="training steps per run")
    parser.add_argument("--out", type=Path, default=Path(str(resources.files("attnlab").joinpath("data", DATA_FILE))))
    args = parser.parse_args(argv)
    if args.smoke:
        rates = chosen_rates()
        points = [PointConfig(s, rates[s], 0, **SMOKE) for s in args.schemes]
        print(summary_table(run_sweep(points, None, jobs=args.jobs)["points"]))
        return
    command = "python -m attnlab.experiments.positions" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    points = sweep_points(tuple(args.schemes), tuple(args.lrs), tuple(args.seeds), steps=args.steps)
    result = run_sweep(points, args.out, jobs=args.jobs, resume=args.resume, command=command)
    print(summary_table(result["points"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
