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

The grid (issue 19) trains on Zoology's MQAR (:func:`attnlab.tasks.mqar_zoology`: power-law
gaps, L = 64 with 8 pairs and L = 128 with 16) seven architectures at two widths each: stage
(a) scans three learning rates with one seed and selects on a validation set, stage (b) trains
three fresh seeds at the selected rate and scores them on a test set used for nothing else,
with accuracy by how far back the queried pair is. It writes ``attnlab/data/mqar_grid.json``
after every point (``--resume`` skips those done); ``--backend ray`` runs the same points as
Ray tasks, locally or on a cluster (``--address``), with identical results:

    python -m attnlab.experiments.mqar grid --pilot       # seconds per step of every grid model
    python -m attnlab.experiments.mqar grid --resume      # the grid, about 6 core-hours
    python -m attnlab.experiments.mqar grid --backend ray --workers 2 --resume
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from importlib import resources
from pathlib import Path

import torch

from ..bench import format_table
from . import _sweep
from ..hybrid import HybridConfig, HybridLM, LayerSpec
from ..tasks import mqar, mqar_zoology
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
    trained model if ``return_model``. ``accuracy`` is the best of the evaluations on the held-out
    prompts that also decide when training stops (an optimistic, selected estimate), and the model
    returned is the one at the end of training, not the one that scored it."""
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


# ---------------------------------------------------------------------------------------------
# The grid (issue 19): Zoology's MQAR at two task sizes, a learning-rate scan selected on a
# validation set, then three fresh seeds at the selected rate scored on a test set.
# ---------------------------------------------------------------------------------------------

GRID_ARCHITECTURES = {
    "attention": ("attention", "attention"),
    "sliding_window": ("local_attention", "local_attention"),
    "linear_attention": ("linear_attention", "linear_attention"),
    "mamba": ("mamba", "mamba"),
    "hybrid": ("mamba", "attention"),
    "conv_attention": ("short_conv", "attention"),       # the hybrid with Mamba's scan taken out
    "hybrid_deep": ("mamba", "mamba", "mamba", "attention"),   # r = 1/4
}
GRID_TASKS = ((32, 8), (64, 8))            # (seq_len, n_pairs): the length axis at 8 pairs
GRID_LRS = (1e-3, 3e-3, 1e-2)
SCAN_SEED = 0
TEST_SEEDS = (1, 2, 3)
VAL_SEED, TEST_SEED = 2_000_000_011, 3_000_000_019     # far from every training batch's seed
GRID_FILE = "mqar_grid.json"
# Two widths per mixer and task size, set by probes and the budget (they bracket the transition of
# attention and the hybrids; Mamba, the window and linear attention fail at both), sized by the pilot.
#
# Why these widths (probes of 2026-11-25, x86_64, 2 cpus, torch 2.13, one thread; two-layer
# attention on L = 64, P = 8, vocabulary 256, random filler, 1,000 steps, best validation
# accuracy): at d = 32 (two heads of 16) attention stays at 0.13-0.18, about 1/P, i.e. it
# returns *a* value of the prompt, not the bound one. That holds at lr 1e-2 and 3e-3, with
# batch 32, 64 or 128, vocabulary 64, 128 or 256, random or zero filler, one head, 3,000 steps,
# and with rotary positions in place of learned ones (0.13); at L = 32, P = 4 it stays at 0.28.
# At d = 64 it solves the task (0.998 at step 500, batch 64, lr 3e-3), at d = 128 by step 300.
# The same d = 32 model solves L = 32, P = 8 (every tail slot a query) by step 600, as it does
# the simplified `mqar`. So attention's transition at L = 64 lies between d = 32 and 64, and the
# grid brackets it there; the other mixers' brackets follow the L = 32 sweep (linear attention
# and Mamba reach recall only near d = 128 there) within the budget.
#
# Why L = 32 and 64 (both P = 8), not 128: the first grid took L = 128 with P = 16 as its
# second task. Its scan (24 points, attention, window, linear attention and Mamba, shipped as
# mqar_grid_l128_scan.json) found nothing above 0.08 within the 1,000-step cap, so it could not
# separate the mixers. Probes at L = 64 with other pair counts (lr at each model's best at P = 8)
# did no better: P = 4 kept attention at 1/P (d = 32: 0.255, d = 64: 0.249), P = 16 at 0.100
# (d = 64). A prompt of P = 8 pairs in 32 tokens has every tail slot a query, the setting the
# d = 32 model solves, so the length axis at P = 8 is the one the cap can resolve.
#
# The pilot (`python -m attnlab.experiments.mqar grid --pilot`, 2026-11-25, same machine, a
# second job on the other core for L = 64, none for L = 32): seconds per step at batch 32, and
# the worst case of one point (1,000 steps, 10 validations, the test), in seconds:
#
#   task       architecture       d   s/step  point      d   s/step  point
#   L32 P8     attention         32   0.085*    85      64   0.038     38
#              sliding_window    32   0.023     23      64   0.033     33
#              linear_attention  64   0.035     36     128   0.080     82
#              mamba             64   0.148    151     128   0.338    344
#              hybrid            32   0.048     49      64   0.088     90
#              conv_attention    32   0.020     20      64   0.038     38
#              hybrid_deep       32   0.118    120      64   0.218    222
#   L64 P8     attention         32   0.068*    68      64   0.050     51
#              sliding_window    32   0.030     31      64   0.050     51
#              linear_attention  64   0.050     51     128   0.120    123
#              mamba             32   0.090     92      64   0.183    186
#              hybrid            32   0.058     59      64   0.115    117
#              conv_attention    32   0.028     28      64   0.053     54
#              hybrid_deep       32   0.140    143      64   0.295    302
#   (* the first point, timed while the process warmed up)
#
# One point of every (task, architecture, width) costs at most 2,687 s; the grid runs each six
# times (3 rates in stage (a), 3 seeds in stage (b)): at most 16,122 s = 4.5 core-hours, less
# where a model reaches 99 % and stops early (attention, the hybrids, conv_attention). Run it in
# slices with --resume (one thread), or fan it out with --backend ray.
PILOT_WORST_SECONDS = {                   # (seq_len, n_pairs, architecture, d_model): the table above
    (32, 8, "attention", 32): 85, (32, 8, "attention", 64): 38,
    (32, 8, "sliding_window", 32): 23, (32, 8, "sliding_window", 64): 33,
    (32, 8, "linear_attention", 64): 36, (32, 8, "linear_attention", 128): 82,
    (32, 8, "mamba", 64): 151, (32, 8, "mamba", 128): 344,
    (32, 8, "hybrid", 32): 49, (32, 8, "hybrid", 64): 90,
    (32, 8, "conv_attention", 32): 20, (32, 8, "conv_attention", 64): 38,
    (32, 8, "hybrid_deep", 32): 120, (32, 8, "hybrid_deep", 64): 222,
    (64, 8, "attention", 32): 68, (64, 8, "attention", 64): 51,
    (64, 8, "sliding_window", 32): 31, (64, 8, "sliding_window", 64): 51,
    (64, 8, "linear_attention", 64): 51, (64, 8, "linear_attention", 128): 123,
    (64, 8, "mamba", 32): 92, (64, 8, "mamba", 64): 186,
    (64, 8, "hybrid", 32): 59, (64, 8, "hybrid", 64): 117,
    (64, 8, "conv_attention", 32): 28, (64, 8, "conv_attention", 64): 54,
    (64, 8, "hybrid_deep", 32): 143, (64, 8, "hybrid_deep", 64): 302,
}
GRID_WIDTHS = {
    "attention": {(32, 8): (32, 64), (64, 8): (32, 64)},
    "sliding_window": {(32, 8): (32, 64), (64, 8): (32, 64)},
    "linear_attention": {(32, 8): (64, 128), (64, 8): (64, 128)},
    "mamba": {(32, 8): (64, 128), (64, 8): (32, 64)},
    "hybrid": {(32, 8): (32, 64), (64, 8): (32, 64)},
    "conv_attention": {(32, 8): (32, 64), (64, 8): (32, 64)},
    "hybrid_deep": {(32, 8): (32, 64), (64, 8): (32, 64)},
}


@dataclass(frozen=True)
class GridPoint:
    """One training run of the grid: Zoology's MQAR (:func:`attnlab.tasks.mqar_zoology`) of
    ``n_pairs`` pairs in ``seq_len`` tokens over ``vocab`` tokens, gaps with ``power_a``."""

    architecture: str
    d_model: int
    seq_len: int = 64
    n_pairs: int = 8
    lr: float = 3e-3
    seed: int = SCAN_SEED
    stage: str = "scan"              # "scan" (learning-rate scan) or "seeds" (at the selected rate)
    vocab: int = 256
    power_a: float = 0.01
    random_filler: bool = True
    n_heads: int = 2
    d_state: int = 16
    window: int = 8
    batch: int = 32
    steps: int = 1000
    warmup: int = 100
    eval_every: int = 100
    val_size: int = 256
    test_size: int = 1024
    solved_at: float = 0.99

    def task(self, batch: int, seed: int):
        return mqar_zoology(batch, self.n_pairs, self.seq_len, vocab=self.vocab, power_a=self.power_a,
                            random_non_queries=self.random_filler, seed=seed)


def build_grid_model(point: GridPoint) -> HybridLM:
    """The model of ``point.architecture`` (a key of ``GRID_ARCHITECTURES``) at width ``point.d_model``."""
    if point.architecture not in GRID_ARCHITECTURES:
        raise ValueError(f"architecture must be one of {sorted(GRID_ARCHITECTURES)}, got {point.architecture!r}")
    config = HybridConfig(vocab=point.vocab, d_model=point.d_model, n_heads=point.n_heads, window=point.window,
                          d_state=point.d_state, max_len=point.seq_len)
    return HybridLM([LayerSpec(kind) for kind in GRID_ARCHITECTURES[point.architecture]], config)


def _predict(model, inputs: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(inputs[i:i + chunk]).argmax(-1) for i in range(0, len(inputs), chunk)])


def recall_profile(model, batch) -> dict:
    """Accuracy on a :class:`attnlab.tasks.ZoologyMQARBatch`, overall and by recency.

    ``pairs_back``: accuracy of the queries for the pair k pairs back from the end of the pairs
    (k = 1 the last pair written), k = 1 … n_pairs, every prompt asking each k once. ``distance``:
    accuracy by tokens from the key to its query, in octaves [lo, hi), with the count of queries.
    """
    if not hasattr(batch, "query_positions"):
        raise TypeError(f"recall_profile: batch must be a ZoologyMQARBatch (attnlab.tasks.mqar_zoology); "
                        f"for the simplified prompts of attnlab.tasks.mqar pass "
                        f"attnlab.recall.as_zoology_batch(batch), got {type(batch).__name__}")
    positions = batch.query_positions()                                   # (b, P), pair j's query
    right = _predict(model, batch.inputs).gather(1, positions) == batch.targets.gather(1, positions)
    distance = positions - 2 * torch.arange(batch.n_pairs)
    octave = torch.log2(distance.double()).floor().long()
    lo = [2 ** int(o) for o in octave.unique()]
    by_octave = [right[octave == o].double() for o in octave.unique()]
    return {"accuracy": right.double().mean().item(),
            "pairs_back": {"k": list(range(1, batch.n_pairs + 1)),
                           "accuracy": [round(a, 4) for a in right.flip(1).double().mean(0).tolist()]},
            "distance": {"lo": lo, "hi": [2 * x for x in lo], "count": [len(r) for r in by_octave],
                         "accuracy": [round(r.mean().item(), 4) for r in by_octave]}}


def parameter_hash(model) -> str:
    """SHA-256 of the model's parameters and buffers (names, dtypes, shapes and bytes), 16 hex digits."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def run_grid_point(point: GridPoint, *, progress: bool = False) -> dict:
    """Train one grid point at one torch thread and return what the grid records (JSON-ready).

    Training batches are fresh prompts (seed ``1_000_003 · seed + step``, the same for every
    model); every ``eval_every`` steps the accuracy on ``val_size`` validation prompts (seed
    ``VAL_SEED``) is recorded and the best weights kept; training stops once it reaches
    ``solved_at``. The kept weights are then scored once on ``test_size`` test prompts (seed
    ``TEST_SEED``), never used for stopping or selection: ``test_accuracy`` and the recency
    profile (:func:`recall_profile`). A run whose loss becomes inf or NaN stops there
    (``diverged``) and is scored with its best weights so far (its initial ones if none).
    """
    from ..bench import threads

    _keep_freed_memory()
    with threads(1):
        torch.manual_seed(point.seed)
        model = build_grid_model(point)
        val, test = point.task(point.val_size, VAL_SEED), point.task(point.test_size, TEST_SEED)
        best = {"accuracy": -1.0, "state": {k: v.clone() for k, v in model.state_dict().items()}}
        curve = {"step": [], "val_accuracy": []}
        now = {"step": 0}

        def evaluate(m):
            accuracy = recall_accuracy(m, val.inputs, val.targets)
            curve["step"].append(now["step"])
            curve["val_accuracy"].append(accuracy)
            if accuracy > best["accuracy"]:
                best.update(accuracy=accuracy, state={k: v.detach().clone() for k, v in m.state_dict().items()})
            return {"accuracy": accuracy}

        def batch_fn(step: int):
            now["step"] = step
            b = point.task(point.batch, point.seed * 1_000_003 + step)
            return b.inputs, b.targets

        start = time.perf_counter()
        try:
            train(model, batch_fn, steps=point.steps, lr=point.lr, warmup=point.warmup, weight_decay=0.1,
                  eval_fn=evaluate, eval_every=point.eval_every,
                  stop_when=lambda e: e["accuracy"] >= point.solved_at, seed=point.seed, progress=progress,
                  description=f"{point.architecture} d={point.d_model} L={point.seq_len}")
            diverged = False
        except FloatingPointError:          # the loss became inf or NaN: keep the best weights so far
            diverged = True
        train_seconds = time.perf_counter() - start
        model.load_state_dict(best["state"])
        profile = recall_profile(model.eval(), test)
        seconds = time.perf_counter() - start
    accuracy = curve["val_accuracy"]
    return {**asdict(point), "task": f"L{point.seq_len} P{point.n_pairs}",
            "state_size": model.state_size(point.seq_len),
            "parameters": sum(p.numel() for p in model.parameters()),
            "val_accuracy": max(best["accuracy"], 0.0),
            "best_step": curve["step"][accuracy.index(best["accuracy"])] if accuracy and best["accuracy"] >= 0 else 0,
            "solved": best["accuracy"] >= point.solved_at, "steps_run": now["step"], "diverged": diverged,
            "test_accuracy": profile["accuracy"], "pairs_back": profile["pairs_back"],
            "distance": profile["distance"], "param_hash": parameter_hash(model),
            "seconds": round(seconds, 1), "train_seconds": round(train_seconds, 1),
            "curve": {"step": curve["step"], "val_accuracy": [round(a, 4) for a in accuracy]}}


def _grid_key(r) -> tuple:
    get = r.get if isinstance(r, dict) else lambda name: getattr(r, name)
    return tuple(get(name) for name in ("stage", "seq_len", "n_pairs", "architecture", "d_model", "lr", "seed"))


def scan_points(architectures=tuple(GRID_ARCHITECTURES), tasks=GRID_TASKS, lrs=GRID_LRS, widths=None,
                **overrides) -> list[GridPoint]:
    """Stage (a): every architecture × task × its two widths × every learning rate, seed ``SCAN_SEED``."""
    widths = widths or GRID_WIDTHS
    return [GridPoint(a, d, seq_len=L, n_pairs=P, lr=lr, seed=SCAN_SEED, stage="scan", **overrides)
            for (L, P) in tasks for a in architectures for d in widths[a][(L, P)] for lr in lrs]


def select_rates(results: list[dict]) -> dict[tuple, float]:
    """The learning rate of each (seq_len, n_pairs, architecture, d_model), chosen on the scan's
    validation accuracy only: the best one, every rate that reached ``solved_at`` counting as
    equal and then the one that got there in the fewest steps; ties to the smaller rate."""
    chosen = {}
    for r in results:
        if r["stage"] != "scan":
            continue
        config = (r["seq_len"], r["n_pairs"], r["architecture"], r["d_model"])
        score = (min(r["val_accuracy"], r["solved_at"]), -r["best_step"], -r["lr"])
        if config not in chosen or score > chosen[config][0]:
            chosen[config] = (score, r["lr"])
    return {config: lr for config, (_, lr) in chosen.items()}


def seed_points(selected: dict[tuple, float], seeds=TEST_SEEDS, **overrides) -> list[GridPoint]:
    """Stage (b): each selected configuration at its rate, with each of ``seeds``."""
    return [GridPoint(a, d, seq_len=L, n_pairs=P, lr=lr, seed=s, stage="seeds", **overrides)
            for (L, P, a, d), lr in selected.items() for s in seeds]


def seed_summary(points: list[dict], seeds=TEST_SEEDS) -> list[dict]:
    """Stage (b), one row per (task, architecture, width) with every one of ``seeds`` present:
    the rate, the state size, the seeds' test accuracies, their mean, min and max, and how many
    of the seeds reached ``solved_at`` on validation. Rows in the grid's order."""
    arch_order = list(GRID_ARCHITECTURES)
    runs: dict[tuple, dict[int, dict]] = {}
    for r in points:
        if r["stage"] == "seeds":
            runs.setdefault((r["seq_len"], r["n_pairs"], r["architecture"], r["d_model"]), {})[r["seed"]] = r
    rows = []
    for (L, P, a, d), by_seed in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                      arch_order.index(kv[0][2]), kv[0][3])):
        if not set(seeds) <= set(by_seed):
            continue
        test = [by_seed[s]["test_accuracy"] for s in seeds]
        rows.append({"task": f"L{L} P{P}", "seq_len": L, "n_pairs": P, "architecture": a, "d_model": d,
                     "lr": by_seed[seeds[0]]["lr"], "state_size": by_seed[seeds[0]]["state_size"],
                     "test": test, "mean": sum(test) / len(test), "min": min(test), "max": max(test),
                     "solved": sum(by_seed[s]["solved"] for s in seeds), "seeds": len(seeds)})
    return rows


def run_grid(scan: list[GridPoint], out: Path | None = None, *, seeds=TEST_SEEDS, stages=("scan", "seeds"),
             resume: bool = False, jobs: int = 1, backend: str = "local", address: str | None = None,
             workers: int = 2, progress: bool = True, command: str = "") -> dict:
    """Run stage (a), the ``scan`` points, then stage (b): ``seeds`` at each configuration's selected
    rate (:func:`select_rates`). Resumable; ``out`` is rewritten after every point. ``backend``
    "ray" runs the points as Ray tasks (local Ray of ``workers`` CPUs, or the cluster at
    ``address``); the results are the same as the local backend's."""
    if backend not in ("local", "ray"):
        raise ValueError(f"backend must be 'local' or 'ray', got {backend!r}")
    executor = None
    if backend == "ray":
        from ._ray import ray_executor

        executor = ray_executor(run_grid_point, address=address, workers=workers)
    arch_order = list(GRID_ARCHITECTURES)
    head = _sweep.header(command, lrs=list(GRID_LRS), scan_seed=SCAN_SEED, test_seeds=list(seeds),
                         val_seed=VAL_SEED, test_seed=TEST_SEED, backend=backend)
    common = dict(run_point=run_grid_point, key=_grid_key, out=out, jobs=jobs, executor=executor, indent=None,
                  progress=progress, sort=lambda r: (r["stage"] != "scan", r["seq_len"],
                                                     arch_order.index(r["architecture"]), r["d_model"], r["lr"],
                                                     r["seed"]))
    points = []
    if "scan" in stages:
        result = _sweep.run_points(scan, head=head, resume=resume, desc="MQAR grid, stage (a) scan",
                                   order=lambda p: (p.seq_len, arch_order.index(p.architecture), p.d_model, p.lr),
                                   **common)
        points = result["points"]
    if "seeds" in stages:
        if out is not None and out.exists() and (resume or "scan" in stages):
            points = json.loads(out.read_text())["points"]
        wanted = {(p.seq_len, p.n_pairs, p.architecture, p.d_model) for p in scan}
        selected = {c: lr for c, lr in select_rates(points).items() if c in wanted}
        missing = wanted - set(selected)
        if missing:
            raise ValueError(f"stage (b) needs the scan of {sorted(missing)[:3]} (run stage (a) first)")
        overrides = {f.name: getattr(scan[0], f.name) for f in fields(GridPoint)
                     if f.name not in ("architecture", "d_model", "seq_len", "n_pairs", "lr", "seed", "stage")}
        head["selected"] = [{"seq_len": L, "n_pairs": P, "architecture": a, "d_model": d, "lr": lr}
                            for (L, P, a, d), lr in sorted(selected.items())]
        result = _sweep.run_points(seed_points(selected, seeds, **overrides), head=head, resume=True,
                                   desc="MQAR grid, stage (b) seeds",
                                   order=lambda p: (p.seed, p.seq_len, arch_order.index(p.architecture),
                                                    p.d_model), **common)
        points = result["points"] if out is not None else points + result["points"]
    return {**head, "points": points}


def projected_seconds(k: int, costs=None) -> float:
    """Wall seconds of the default grid on ``k`` one-thread workers, from the pilot's worst-case
    point costs: stage (a)'s points, then stage (b)'s (3 seeds each), each stage scheduled longest
    first onto the worker free first."""
    import heapq

    costs = costs or PILOT_WORST_SECONDS
    total = 0.0
    for repeat in (len(GRID_LRS), len(TEST_SEEDS)):
        free = [0.0] * k
        for cost in sorted([c for c in costs.values() for _ in range(repeat)], reverse=True):
            heapq.heappush(free, heapq.heappop(free) + cost)
        total += max(free)
    return total


def load_grid(name: str = GRID_FILE) -> dict:
    """The shipped grid (its header records the command, machine, torch version and date)."""
    return _sweep.load_data(name)


def grid_summary(points: list[dict]) -> str:
    """One row per point: stage, task, architecture, width, rate, seed, val and test accuracy, steps, seconds."""
    keys = ("stage", "task", "architecture", "d_model", "lr", "seed", "state_size", "val_accuracy",
            "test_accuracy", "steps_run", "seconds")
    return format_table([{k: r[k] for k in keys} for r in points], floatfmt=".3g")


def pilot(tasks=GRID_TASKS, architectures=tuple(GRID_ARCHITECTURES), steps: int = 40, progress: bool = True,
          **overrides) -> list[dict]:
    """Seconds per training step of each architecture at each of its grid widths, per task size, at
    one thread (``steps`` steps, no early stopping), and the worst-case cost of one point: the step
    cap times the step, plus one validation every ``eval_every`` steps and the test."""
    rows = []
    for (L, P) in tasks:
        for a in architectures:
            for d in GRID_WIDTHS[a][(L, P)]:
                point = GridPoint(a, d, seq_len=L, n_pairs=P, **overrides)
                probe = replace(point, steps=steps, warmup=5, eval_every=steps, solved_at=2.0)
                r = run_grid_point(probe)
                per_step = r["train_seconds"] / steps
                worst = point.steps * per_step + (point.steps // point.eval_every) * (
                    r["seconds"] - r["train_seconds"]) * point.val_size / (point.val_size + point.test_size)
                rows.append({"task": r["task"], "architecture": a, "d_model": d, "s/step": round(per_step, 4),
                             "point, worst s": round(worst, 1)})
                if progress:
                    print(rows[-1], flush=True)
    return rows


def grid_main(argv) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnlab.experiments.mqar grid",
                                     description="Zoology's MQAR: learning-rate scan (a), then seeds at the "
                                                 "selected rate (b); writes attnlab/data/" + GRID_FILE)
    parser.add_argument("--architectures", nargs="+", default=list(GRID_ARCHITECTURES),
                        choices=list(GRID_ARCHITECTURES))
    parser.add_argument("--tasks", nargs="+", default=[f"{L}x{P}" for L, P in GRID_TASKS],
                        help="task sizes as LENGTHxPAIRS (widths from GRID_WIDTHS, or --widths)")
    parser.add_argument("--widths", nargs="+", type=int, help="the same widths for every architecture and task")
    parser.add_argument("--lrs", nargs="+", type=float, default=list(GRID_LRS))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(TEST_SEEDS), help="stage (b) seeds")
    parser.add_argument("--stage", choices=["scan", "seeds", "all"], default="all")
    parser.add_argument("--steps", type=int, default=GridPoint.steps, help="most training steps per point")
    parser.add_argument("--batch", type=int, default=GridPoint.batch)
    parser.add_argument("--vocab", type=int, default=GridPoint.vocab)
    parser.add_argument("--val-size", type=int, default=GridPoint.val_size)
    parser.add_argument("--test-size", type=int, default=GridPoint.test_size)
    parser.add_argument("--backend", choices=["local", "ray"], default="local")
    parser.add_argument("--address", help="with --backend ray: a running cluster (default: start a local Ray)")
    parser.add_argument("--workers", type=int, default=2, help="with --backend ray and no --address: local CPUs")
    parser.add_argument("--jobs", type=int, default=1, help="local backend: processes (one torch thread each)")
    parser.add_argument("--resume", action="store_true", help="keep the points already in --out")
    parser.add_argument("--pilot", action="store_true", help="time one point per architecture and task; writes nothing")
    parser.add_argument("--out", type=Path, default=Path(str(resources.files("attnlab").joinpath("data", GRID_FILE))))
    args = parser.parse_args(argv)
    tasks = []
    for text in args.tasks:
        try:
            L, P = (int(x) for x in text.lower().split("x"))
        except ValueError:
            parser.error(f"--tasks: expected LENGTHxPAIRS such as 64x8, got {text!r}")
        tasks.append((L, P))
    if args.pilot:
        print(format_table(pilot(tuple(tasks), tuple(args.architectures)), floatfmt=".4g"))
        return
    widths = None if args.widths is None else {a: {t: tuple(args.widths) for t in tasks} for a in GRID_ARCHITECTURES}
    scan = scan_points(tuple(args.architectures), tuple(tasks), tuple(args.lrs), widths, steps=args.steps,
                       batch=args.batch, vocab=args.vocab, val_size=args.val_size, test_size=args.test_size)
    stages = ("scan", "seeds") if args.stage == "all" else (args.stage,)
    command = "python -m attnlab.experiments.mqar grid" + "".join(f" {a}" for a in argv)
    result = run_grid(scan, args.out, seeds=tuple(args.seeds), stages=stages, resume=args.resume, jobs=args.jobs,
                      backend=args.backend, address=args.address, workers=args.workers, command=command)
    print(grid_summary(result["points"]))
    print(f"wrote {args.out}")


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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["grid"]:
        grid_main(argv[1:])
        return
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
