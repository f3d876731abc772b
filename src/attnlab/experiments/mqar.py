"""The recall lab: which sequence mixers solve multi-query associative recall, at what state size.

Each point of the sweep trains a two-layer :class:`attnlab.hybrid.HybridLM` on fresh
:func:`attnlab.tasks.mqar` batches until it recalls ≥ 99 % of held-out queries or runs out of
steps, and records its accuracy against the state it keeps per sequence at inference
(:meth:`HybridLM.state_size` at the task's length, in numbers). The design follows Arora et
al. 2023 ("Zoology", accuracy against model width) and 2024 ("Based", against state size): one
line per mixer, points from the model width.

    python -m attnlab.experiments.mqar --smoke            # seconds: one small point per mixer
    python -m attnlab.experiments.mqar --jobs 2           # the full sweep (about 35 min on 2 cores)

The full sweep writes ``attnlab/data/mqar_sweep.json`` after every point, and ``--resume``
skips the points already there.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import torch

from ..bench import format_table
from . import _sweep
from ..hybrid import HybridConfig, HybridLM, LayerSpec
from ..tasks import mqar
from ..train import train

# Each architecture is two residual layers, each a mixer followed by an MLP.
ARCHITECTURES = {
    "attention": ("attention", "attention"),
    "sliding_window": ("local_attention", "local_attention"),
    "linear_attention": ("linear_attention", "linear_attention"),
    "mamba": ("mamba", "mamba"),
    "hybrid": ("mamba", "attention"),
}
WIDTHS = (16, 32, 64, 128)
DATA_FILE = "mqar_sweep.json"


@dataclass(frozen=True)
class PointConfig:
    """One training run of the sweep."""

    architecture: str
    d_model: int
    n_pairs: int = 8
    n_keys: int = 64
    n_values: int = 64
    n_heads: int = 2
    d_state: int = 16
    window: int = 8
    batch: int = 64
    lr: float = 3e-3
    steps: int = 2000
    warmup: int = 100
    eval_every: int = 100
    eval_size: int = 512
    solved_at: float = 0.99
    seed: int = 0

    @property
    def seq_len(self) -> int:
        return 4 * self.n_pairs          # every key is queried once


def build_model(point: PointConfig) -> HybridLM:
    """The two-layer model of ``point.architecture`` at width ``point.d_model``."""
    if point.architecture not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {sorted(ARCHITECTURES)}, got {point.architecture!r}")
    config = HybridConfig(vocab=point.n_keys + point.n_values, d_model=point.d_model, n_heads=point.n_heads,
                          window=point.window, d_state=point.d_state, max_len=point.seq_len)
    return HybridLM([LayerSpec(kind) for kind in ARCHITECTURES[point.architecture]], config)


def recall_accuracy(model: HybridLM, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Fraction of query positions (targets ≠ −100) where the most likely next token is the right value."""
    asked = targets != -100
    predictions = model(inputs).argmax(-1)
    return (predictions[asked] == targets[asked]).float().mean().item()


def run_point(point: PointConfig, *, progress: bool = False, return_model: bool = False):
    """Train one model on MQAR and return what the sweep records (a JSON-ready dict), and the
    trained model if ``return_model``."""
    _keep_freed_memory()
    torch.manual_seed(point.seed)
    model = build_model(point)
    task = dict(n_pairs=point.n_pairs, n_keys=point.n_keys, n_values=point.n_values)
    held_out = mqar(point.eval_size, seed=10_000_019 + point.seed, **task)

    def batch_fn(step: int):
        b = mqar(point.batch, seed=point.seed * 1_000_003 + step, **task)
        return b.inputs, b.targets

    start = time.perf_counter()
    history = train(model, batch_fn, steps=point.steps, lr=point.lr, warmup=point.warmup, weight_decay=0.1,
                    eval_fn=lambda m: {"accuracy": recall_accuracy(m, held_out.inputs, held_out.targets)},
                    eval_every=point.eval_every, stop_when=lambda e: e["accuracy"] >= point.solved_at,
                    seed=point.seed, progress=progress, description=f"{point.architecture} d={point.d_model}")
    seconds = time.perf_counter() - start
    steps, accuracy = history.eval_series("accuracy")
    result = {**asdict(point), "state_size": model.state_size(point.seq_len),
              "parameters": sum(p.numel() for p in model.parameters()),
              "accuracy": max(accuracy), "solved": max(accuracy) >= point.solved_at,
              "steps_run": history.steps[-1], "seconds": round(seconds, 1),
              "curve": {"step": steps, "accuracy": [round(a, 4) for a in accuracy]}}
    return (result, model) if return_model else result


def sweep_points(widths=WIDTHS, architectures=tuple(ARCHITECTURES), **overrides) -> list[PointConfig]:
    """The grid: every architecture at every width (other settings from ``overrides``)."""
    return [PointConfig(architecture=a, d_model=d, **overrides) for a in architectures for d in widths]


# The notebook's live run: half the task, 300 steps, at the learning rate tuned for it.
SMOKE = dict(widths=(32,), n_pairs=4, steps=300, eval_every=25, eval_size=256, lr=1e-2, warmup=30)


def _keep_freed_memory() -> None:
    """Ask glibc to keep freed large blocks for reuse: a training step frees and re-allocates the
    same (L, b, d_inner, d_state) scan tensors, and mapping them afresh each time (page faults)
    roughly doubles Mamba's step time here. No effect off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(-3, 1 << 30)     # M_MMAP_THRESHOLD
    libc.mallopt(-1, 1 << 30)     # M_TRIM_THRESHOLD


def _key(r) -> tuple:
    return (r["architecture"], r["d_model"]) if isinstance(r, dict) else (r.architecture, r.d_model)


def run_sweep(points: list[PointConfig], out: Path | None = None, *, jobs: int = 1, resume: bool = False,
              progress: bool = True, command: str = "") -> dict:
    """Run every point (``jobs`` processes of one thread each), writing ``out`` after each one."""
    head = _sweep.header(command, seed=points[0].seed if points else 0)
    arch_order = list(ARCHITECTURES)
    return _sweep.run_points(points, run_point, key=_key, head=head, out=out, resume=resume, jobs=jobs,
                             order=lambda p: (-p.d_model, p.architecture not in ("mamba", "hybrid")),
                             sort=lambda r: (arch_order.index(r["architecture"]), r["d_model"]),
                             indent=1, progress=progress, desc="MQAR sweep")


def load_sweep(name: str = DATA_FILE) -> dict:
    """A precomputed sweep shipped in ``attnlab/data/`` (its header records the command that wrote it)."""
    return _sweep.load_data(name)


def summary(points: list[dict]) -> str:
    """One row per point: architecture, width, state size, accuracy, steps, seconds."""
    keys = ("architecture", "d_model", "state_size", "accuracy", "steps_run", "seconds")
    return format_table([{k: r[k] for k in keys} for r in points], floatfmt=".3f")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="one small, short point per architecture; writes nothing")
    parser.add_argument("--jobs", type=int, default=1, help="processes (one torch thread each)")
    parser.add_argument("--resume", action="store_true", help="keep the points already in --out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--architectures", nargs="+", default=list(ARCHITECTURES), choices=list(ARCHITECTURES))
    parser.add_argument("--widths", nargs="+", type=int, default=list(WIDTHS), help="d_model values")
    parser.add_argument("--steps", type=int, default=PointConfig.steps, help="most training steps per point")
    parser.add_argument("--lr", type=float, default=PointConfig.lr, help="peak learning rate")
    parser.add_argument("--out", type=Path, default=Path(str(resources.files("attnlab").joinpath("data", DATA_FILE))))
    args = parser.parse_args(argv)
    if args.smoke:
        options = dict(SMOKE)
        points = sweep_points(options.pop("widths"), seed=args.seed, **options)
        print(summary(run_sweep(points, None, jobs=args.jobs)["points"]))
        return
    command = "python -m attnlab.experiments.mqar" + "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    points = sweep_points(tuple(args.widths), tuple(args.architectures), seed=args.seed, steps=args.steps, lr=args.lr)
    result = run_sweep(points, args.out, jobs=args.jobs, resume=args.resume, command=command)
    print(summary(result["points"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
