"""Expert collapse with and without the Switch balancing loss: the toy MoE regressor of chapter 12.

Each point is one :func:`attnlab.moe.toy_routing_run` (16-d inputs, 8 experts, top-1, 300 Adam
steps, batch 256, seeded): the auxiliary-loss weight α ∈ {0, 0.01, 0.1} × learning rate
{1e-3, 3e-3, 1e-2} (the same grid for every α) × seeds {0, 1, 2}. Recorded per run: the load
of every expert on 4,096 held-out inputs (never used for training or selection) *before* the
first step and after the last, the dead experts at both times (load below 1%), the load
entropy along training and the held-out MSE.

    python -m attnlab.experiments.moe_routing --smoke   # seconds: one short run
    python -m attnlab.experiments.moe_routing           # the 27 runs, one thread, about a minute
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass

from ..moe import load_entropy, toy_routing_run
from . import _sweep

DATA_FILE = "moe_routing.json"
ALPHAS = (0.0, 0.01, 0.1)
LRS = (1e-3, 3e-3, 1e-2)
SEEDS = (0, 1, 2)
DEAD = 0.01            # an expert with less than 1% of the held-out routing slots is dead


@dataclass(frozen=True)
class PointConfig:
    """One routing run."""

    alpha: float
    lr: float = 1e-2
    seed: int = 0
    n_experts: int = 8
    top_k: int = 1
    steps: int = 300
    in_dim: int = 16


def run_point(point: PointConfig) -> dict:
    """Train one toy MoE regressor; its held-out expert load and dead experts before and after training,
    the load entropy along training and the held-out MSE."""
    start = time.perf_counter()
    run = toy_routing_run(point.alpha, n_experts=point.n_experts, top_k=point.top_k, steps=point.steps,
                          seed=point.seed, lr=point.lr, in_dim=point.in_dim)
    load = [round(float(v), 6) for v in run["load"]]
    load_init = [round(float(v), 6) for v in run["load_init"]]
    return {**asdict(point), "load_init": load_init, "load": load,
            "dead_init": sum(v < DEAD for v in load_init), "dead": sum(v < DEAD for v in load),
            "entropy_init": round(load_entropy(run["load_init"]), 5), "entropy_final": round(load_entropy(run["load"]), 5),
            "steps_recorded": run["steps"], "entropy": [round(v, 5) for v in run["entropy"]],
            "mse": round(run["mse"], 6), "seconds": round(time.perf_counter() - start, 1)}


def _key(r) -> tuple:
    if isinstance(r, PointConfig):
        return (r.alpha, r.lr, r.seed)
    return (r["alpha"], r["lr"], r["seed"])


def dead_table(points: list[dict], field: str = "dead") -> dict[tuple[float, float], list[int]]:
    """``field`` ("dead" after training, "dead_init" before it) per seed (in seed order) for every (α, lr)."""
    out: dict[tuple[float, float], list[int]] = {}
    for r in sorted(points, key=_key):
        out.setdefault((r["alpha"], r["lr"]), []).append(r[field])
    return out


def load(name: str = DATA_FILE) -> dict:
    """The shipped runs (the header records the command that wrote them)."""
    return _sweep.load_data(name)


def main(argv=None) -> None:
    args = _sweep.sweep_args(__doc__.split("\n\n")[0], DATA_FILE, argv)
    points = ([PointConfig(0.0, steps=20)] if args.smoke
              else [PointConfig(a, lr, s) for a in ALPHAS for lr in LRS for s in SEEDS])
    command = "python -m attnlab.experiments.moe_routing" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]) if a != "--resume")
    head = _sweep.header(command, alphas=list(ALPHAS), lrs=list(LRS), seeds=list(SEEDS), dead_below=DEAD,
                         held_out="4,096 inputs from their own generator, routed before and after training, "
                                  "used for nothing else")
    result = _sweep.run_points(points, run_point, key=_key, head=head,
                               out=None if args.smoke else args.out, resume=args.resume,
                               progress=False, indent=1, desc="moe routing")
    for field in ("dead_init", "dead"):
        for (alpha, lr), dead in dead_table(result["points"], field).items():
            print(f"{field}: alpha = {alpha}, lr = {lr}: per seed {dead}")
    if not args.smoke:
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
