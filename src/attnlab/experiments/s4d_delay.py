"""Chapter 10's delayed copy, trained with two ranges of the initial step Δ and several seeds.

One S4D-Lin layer (:class:`attnlab.s4d.S4D`, d = 4 channels, n = 64) learns to delay channel c
by τ_c ∈ {8, 32, 64, 128} tokens. Inputs are white noise smoothed by a Gaussian of width 4
(:func:`smooth_noise`), fresh at every step; Adam at one learning rate (2e-2) for every
parameter, 400 steps of 16 signals, L = 256. The held-out error is the relative error
Σ(ŷ − y)² / Σy² per channel on 256 signals drawn from their own seed (10**6), used for
nothing else: no early stopping, no selection.

The two arms differ only in the range from which log Δ is drawn: the chapter's [0.004, 0.016]
and S4D's default [0.001, 0.1]; seeds 0 … 4 set the initialisation (and the training data, seed
1 + seed). Seed 0 of the chapter's range is the run the chapter trains live. Recorded per run:
the held-out error per delay; per channel Δ and the median |Re a| and Δ·|Re a| (the decay per
token) before and after training.

    python -m attnlab.experiments.s4d_delay --smoke   # seconds: one short run, nothing written
    python -m attnlab.experiments.s4d_delay           # the 10 runs, one thread, about 30 s
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..s4d import S4D
from . import _sweep

DATA_FILE = "s4d_delay.json"
DELAYS = (8, 32, 64, 128)
DT_RANGES = {"chapter": (0.004, 0.016), "s4d default": (0.001, 0.1)}
SEEDS = (0, 1, 2, 3, 4)
TEST_SEED = 10**6
LR = 2e-2


def smooth_noise(batch: int, d: int, length: int, width: float,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """White noise convolved with a Gaussian of standard deviation ``width`` tokens, unit power
    per token: (batch, d, length)."""
    x = torch.randn(batch * d, 1, length + 6 * int(width), generator=generator)
    g = torch.exp(-0.5 * (torch.arange(-3 * int(width), 3 * int(width) + 1) / width) ** 2)
    return F.conv1d(x, (g / g.norm())[None, None]).reshape(batch, d, -1)[..., :length]


def delayed(u: torch.Tensor, delays) -> torch.Tensor:
    """Channel c of the target is channel c of u (b, d, L) shifted right by ``delays[c]``."""
    y = torch.zeros_like(u)
    for c, tau in enumerate(delays):
        if tau < u.shape[-1]:                     # a delay past the end leaves zeros
            y[:, c, tau:] = u[:, c, :u.shape[-1] - tau]
    return y


def relative_error(y_hat: torch.Tensor, y: torch.Tensor) -> list[float]:
    """Σ_t (ŷ − y)² / Σ_t y² per channel, summed over the batch: zeros score 1."""
    return ((y_hat - y).square().sum((0, 2)) / y.square().sum((0, 2))).tolist()


@dataclass(frozen=True)
class PointConfig:
    """One training run."""

    dt_range: str
    seed: int = 0
    d_state: int = 64
    length: int = 256
    width: int = 4
    batch: int = 16
    steps: int = 400
    lr: float = LR
    n_test: int = 256


def decay_summary(layer: S4D) -> dict:
    """Per channel: Δ, the median |Re a| over modes, and the median Δ·|Re a| (decay per token)."""
    with torch.no_grad():
        dt = layer.log_dt.exp()
        rate = layer.log_A_re.exp().median(-1).values
        decay = (dt[:, None] * layer.log_A_re.exp()).median(-1).values
    return {"dt": [round(v, 6) for v in dt.tolist()],
            "re_a": [round(v, 4) for v in rate.tolist()],
            "decay_per_token": [round(v, 6) for v in decay.tolist()]}


def run_point(point: PointConfig) -> dict:
    """Train one S4D-Lin layer on the delays; its held-out errors and how its decays moved."""
    start = time.perf_counter()
    dt_min, dt_max = DT_RANGES[point.dt_range]
    layer = S4D(len(DELAYS), point.d_state, init="lin", dt_min=dt_min, dt_max=dt_max,
                generator=torch.Generator().manual_seed(point.seed))
    before = decay_summary(layer)
    opt = torch.optim.Adam(layer.parameters(), lr=point.lr)
    g_data = torch.Generator().manual_seed(1 + point.seed)
    for _ in range(point.steps):
        u = smooth_noise(point.batch, len(DELAYS), point.length, point.width, g_data)
        loss = F.mse_loss(layer(u), delayed(u, DELAYS))
        opt.zero_grad()
        loss.backward()
        opt.step()
    u_test = smooth_noise(point.n_test, len(DELAYS), point.length, point.width,
                          torch.Generator().manual_seed(TEST_SEED))
    with torch.no_grad():
        errors = relative_error(layer(u_test), delayed(u_test, DELAYS))
    return {**asdict(point), "dt_bounds": list(DT_RANGES[point.dt_range]),
            "test_error": [round(e, 5) for e in errors], "before": before,
            "after": decay_summary(layer), "seconds": round(time.perf_counter() - start, 1)}


def _key(r) -> tuple:
    if isinstance(r, PointConfig):
        return (r.dt_range, r.seed)
    return (r["dt_range"], r["seed"])


def errors_by_range(points: list[dict]) -> dict[str, list[list[float]]]:
    """Held-out errors (one list per delay) of every seed, in seed order, for each Δ range."""
    out: dict[str, list[list[float]]] = {}
    for r in sorted(points, key=_key):
        out.setdefault(r["dt_range"], []).append(r["test_error"])
    return out


def load(name: str = DATA_FILE) -> dict:
    """The shipped runs (the header records the command that wrote them)."""
    return _sweep.load_data(name)


def main(argv=None) -> None:
    args = _sweep.sweep_args(__doc__.split("\n\n")[0], DATA_FILE, argv)
    points = ([PointConfig("chapter", steps=10, n_test=16)] if args.smoke
              else [PointConfig(r, s) for r in DT_RANGES for s in SEEDS])
    command = "python -m attnlab.experiments.s4d_delay" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]) if a != "--resume")
    head = _sweep.header(command, delays=list(DELAYS), dt_ranges=DT_RANGES, seeds=list(SEEDS),
                         lr=LR, held_out=f"256 signals from seed {TEST_SEED}, used for nothing else")
    result = _sweep.run_points(points, run_point, key=_key, head=head,
                               out=None if args.smoke else args.out, resume=args.resume,
                               progress=False, indent=1, desc="s4d delay")
    for name, errors in errors_by_range(result["points"]).items():
        print(f"Δ range {name}: largest held-out error per seed",
              [round(max(e), 3) for e in errors])
    if not args.smoke:
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
