"""Selective copying with a tiny Mamba, and the same model with its selection switched off.

Two arms, the same two-layer :class:`attnlab.ssm.MambaLM` (width 16, d_state 8):

* ``selective``: Mamba as it is, Δ_t, B_t and C_t computed from each token;
* ``fixed``: the same block with Δ, B and C that do not depend on the token (Δ = softplus of a
  learned per-channel bias, B and C learned vectors): a time-invariant SSM inside the same
  projections, convolution and gate (:class:`FixedMamba`).

Each arm is trained at every rate of one grid with three seeds on fresh batches of
:func:`attnlab.tasks.selective_copying` (4 data tokens from 8 values among 4 noise ids, a
context of 32, then 4 markers). The rate is chosen per arm by the mean validation accuracy
(1,024 prompts, ``VAL_SEED``); the test accuracy is read on 4,096 other prompts
(``TEST_SEED``), used for nothing else. The mean step size Δ on data, noise and marker tokens
of the test prompts is recorded per layer.

    python -m attnlab.experiments.selective_copy --smoke     # seconds: one short point per arm
    python -m attnlab.experiments.selective_copy             # the sweep (24 runs, resumable)
    python -m attnlab.experiments.selective_copy --weights   # retrain the shipped models

``--weights`` retrains the selective arm at its chosen rate with each seed (training is
deterministic at one thread) and writes the three models' weights to ``selective_copy.pt``.
:func:`ablated_accuracy` evaluates a shipped model with the token-dependence of Δ, B or C removed
in one layer (each replaced by its running mean over the prompt so far, which keeps the model causal): the
chapter's test of which layer selects.
"""
from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import resources

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ssm import Mamba, MambaConfig, MambaLM
from ..tasks import selective_copying
from ..train import train
from . import _sweep

DATA_FILE, WEIGHTS_FILE = "selective_copy.json", "selective_copy.pt"
ARMS = ("selective", "fixed")
LRS = (3e-3, 1e-2, 3e-2, 1e-1)
SEEDS = (0, 1, 2)
TASK = dict(n_data=4, length=32, n_values=8, n_noise=4)
VAL_SEED, TEST_SEED = 2 * 10**6, 10**6


@dataclass(frozen=True)
class PointConfig:
    """One training run: arm, rate, seed."""

    arm: str
    lr: float
    seed: int = 0
    d_model: int = 16
    d_state: int = 8
    n_layers: int = 2
    batch: int = 32
    steps: int = 1500
    warmup: int = 50
    n_val: int = 1024
    n_test: int = 4096


class FixedMamba(Mamba):
    """A Mamba block whose Δ, B and C do not depend on the token: a time-invariant SSM in Mamba's frame.

    Δ = softplus(b_Δ) per channel (the dt bias, initialised as in Mamba), B and C learned (n,)
    vectors shared by every token. The projections, the convolution, the gate SiLU(z) and D are
    Mamba's (x_proj is left in place, unused).
    """

    def __init__(self, config: MambaConfig):
        super().__init__(config)
        self.B_fixed = nn.Parameter(0.5 * torch.randn(config.d_state))
        self.C_fixed = nn.Parameter(0.5 * torch.randn(config.d_state))

    def _ssm_inputs(self, x: torch.Tensor):
        c = self.config
        dt = x.new_zeros(*x.shape[:-1], c.d_inner)
        return dt, self.B_fixed.expand(*x.shape[:-1], -1), self.C_fixed.expand(*x.shape[:-1], -1)


def build_model(point: PointConfig) -> MambaLM:
    """The arm's model, initialised from ``point.seed``."""
    torch.manual_seed(point.seed)
    config = MambaConfig(d_model=point.d_model, d_state=point.d_state)
    model = MambaLM(TASK["n_noise"] + TASK["n_values"] + 1, point.n_layers, config)
    if point.arm == "fixed":
        model.mixers = nn.ModuleList(FixedMamba(config) for _ in range(point.n_layers))
    elif point.arm != "selective":
        raise ValueError(f"arm must be one of {ARMS}, got {point.arm!r}")
    return model


@torch.no_grad()
def gates(model: MambaLM, tokens: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    r"""What every token does to each layer's state: the mixer's forward up to the scan, layer by layer.

    Per layer, ``"delta"``: Δ_t (b, L, d_inner), the forget side (the decay is e^{Δ_t A});
    ``"write"``: :math:`\lVert \Delta_t \odot x_t \rVert\,\lVert B_t \rVert` (b, L), the Frobenius norm
    of what the token adds to the (d_inner, n) state, :math:`\Delta_t x_t B_t^\top`.
    """
    x, out = model.embed(tokens), []
    for norm, mixer in zip(model.norms, model.mixers):
        u = norm(x)
        xs = mixer.in_proj(u).chunk(2, dim=-1)[0]
        xs = F.silu(mixer.conv1d(xs.transpose(1, 2))[..., :tokens.shape[1]]).transpose(1, 2)
        dt, B, _ = mixer._ssm_inputs(xs)
        delta = F.softplus(dt + mixer.dt_proj.bias)
        out.append({"delta": delta, "write": (delta * xs).norm(dim=-1) * B.norm(dim=-1)})
        x = x + mixer(u)
    return out


def step_sizes(model: MambaLM, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Δ_t of every layer, (b, L, d_inner) each."""
    return [g["delta"] for g in gates(model, tokens)]


@torch.no_grad()
def accuracy(model: MambaLM, prompts) -> float:
    """Share of the marker positions where the argmax is the right data token."""
    model.eval()
    logits = model(prompts.inputs)
    asked = prompts.targets != -100
    return (logits.argmax(-1)[asked] == prompts.targets[asked]).float().mean().item()


SELECTION_PARTS = ("delta", "B", "C")


@contextmanager
def frozen_to_mean(model: MambaLM, parts=("delta",), layers=None):
    r"""An ablation: inside the ``with`` block, the chosen selection inputs of a layer stop depending on the token.

    Each of ``parts`` ("delta", "B", "C") of every mixer in ``layers`` (0-based; None: all) is replaced at
    position t by its causal running mean over positions s ≤ t of the same prompt,
    m_t = (1/(t+1)) Σ_{s≤t} v_s: Δ_t (b, L, d_inner), after the bias and the softplus, per channel (the
    mixer is handed softplus⁻¹(m_t) − b_Δ, so that its softplus gives m_t back); B_t and C_t (b, L, n)
    per state. Everything else runs as trained. The layer then no longer writes or decays more on one
    token than on the next by that token's content (its selection through that part removed), while the
    prompt so far still sets the values, and nothing reads a later position: the ablated model stays
    causal, so its accuracy is one a causal model could reach.
    """
    unknown = set(parts) - set(SELECTION_PARTS)
    if unknown or isinstance(parts, str):
        raise ValueError(f"frozen_to_mean: parts must be a collection of {SELECTION_PARTS}, got {parts!r}")
    chosen = range(len(model.mixers)) if layers is None else layers
    patched = [model.mixers[i] for i in chosen]

    def freeze(mixer, original):
        def ssm_inputs(x):
            dt, B, C = original(x)                                 # (b, L, d_inner), (b, L, n) twice
            count = torch.arange(1, x.shape[-2] + 1, dtype=x.dtype, device=x.device)[:, None]
            mean = lambda t: t.cumsum(-2) / count                    # noqa: E731  (b, L, ·)
            if "delta" in parts:
                delta = mean(F.softplus(dt + mixer.dt_proj.bias))
                dt = delta + torch.log(-torch.expm1(-delta)) - mixer.dt_proj.bias
            return dt, mean(B) if "B" in parts else B, mean(C) if "C" in parts else C
        return ssm_inputs

    for mixer in patched:
        mixer._ssm_inputs = freeze(mixer, mixer._ssm_inputs)       # an instance attribute shadows the method
    try:
        yield model
    finally:
        for mixer in patched:
            del mixer._ssm_inputs


def ablated_accuracy(model: MambaLM, prompts, parts=("delta",), layers=None) -> float:
    """:func:`accuracy` with ``parts`` of ``layers`` frozen to their causal running mean (:func:`frozen_to_mean`)."""
    with frozen_to_mean(model, parts, layers):
        return accuracy(model, prompts)


def _kinds(prompts) -> dict[str, torch.Tensor]:
    return {"data": prompts.is_data, "noise": prompts.is_noise, "marker": prompts.inputs == prompts.marker}


def delta_by_token(model: MambaLM, prompts) -> list[dict]:
    """Per layer, the mean Δ (over channels and prompts) on data, noise and marker tokens."""
    return [{k: delta.mean(-1)[mask].mean().item() for k, mask in _kinds(prompts).items()}
            for delta in step_sizes(model, prompts.inputs)]


def gates_by_token(model: MambaLM, prompts) -> list[dict]:
    """Per layer, the mean Δ and the mean write norm (see :func:`gates`) on data, noise and marker tokens."""
    kinds = _kinds(prompts)
    return [{f"{what} {k}": g[what].mean(-1)[mask].mean().item() if what == "delta" else g[what][mask].mean().item()
             for what in ("delta", "write") for k, mask in kinds.items()}
            for g in gates(model, prompts.inputs)]


def run_point(point: PointConfig, *, return_model: bool = False):
    """Train one model for ``point.steps`` steps; its validation and test accuracy and Δ statistics."""
    start = time.perf_counter()
    model = build_model(point)
    val = selective_copying(point.n_val, **TASK, seed=VAL_SEED)

    def batch(step):
        p = selective_copying(point.batch, **TASK, seed=10**5 * (point.seed + 1) + step)
        return p.inputs, p.targets

    history = train(model, batch, steps=point.steps, lr=point.lr, warmup=point.warmup, seed=point.seed,
                    eval_fn=lambda m: {"val_acc": accuracy(m, val)}, eval_every=100, progress=False)
    test = selective_copying(point.n_test, **TASK, seed=TEST_SEED)
    every = 25
    loss = [sum(history.loss[i:i + every]) / len(history.loss[i:i + every])
            for i in range(0, len(history.loss), every)]
    result = {**asdict(point), "val_acc": accuracy(model, val), "test_acc": accuracy(model, test),
              "delta": delta_by_token(model, test), "val_curve": history.eval_series("val_acc"),
              "loss_every_25": [round(v, 4) for v in loss],
              "seconds": round(time.perf_counter() - start, 1)}
    return (result, model) if return_model else result


def _key(r) -> tuple:
    if isinstance(r, PointConfig):
        return (r.arm, r.lr, r.seed)
    return (r["arm"], r["lr"], r["seed"])


def summarise(points: list[dict]) -> dict[str, dict]:
    """Per arm: the rate with the best mean validation accuracy, and the test accuracy per seed there."""
    out = {}
    for arm in [a for a in ARMS if any(r["arm"] == a for r in points)]:
        grid: dict[float, list[dict]] = {}
        for r in points:
            if r["arm"] == arm:
                grid.setdefault(r["lr"], []).append(r)
        val = {lr: sum(r["val_acc"] for r in rs) / len(rs) for lr, rs in sorted(grid.items())}
        best = max(val, key=val.get)
        runs = sorted(grid[best], key=lambda r: r["seed"])
        out[arm] = {"best_lr": best, "seeds": [r["seed"] for r in runs],
                    "test_acc": [r["test_acc"] for r in runs], "val_by_lr": val,
                    "delta": [r["delta"] for r in runs]}
    return out


def load(name: str = DATA_FILE) -> dict:
    """The shipped sweep (its header records the command that wrote it)."""
    return _sweep.load_data(name)


def load_pretrained() -> list[tuple[MambaLM, dict]]:
    """The shipped selective models (every seed at the arm's chosen rate), each with its record from training."""
    path = resources.files("attnlab").joinpath("data", WEIGHTS_FILE)
    with resources.as_file(path) as f:
        saved = torch.load(f, weights_only=True)
    out = []
    for entry in saved["models"]:
        model = build_model(PointConfig(**entry["point"]))
        model.load_state_dict(entry["state_dict"])
        out.append((model.eval(), entry["record"]))
    return out


def main(argv=None) -> None:
    def weights_option(parser):
        parser.add_argument("--weights", action="store_true", help="retrain the shipped models and save them")

    args = _sweep.sweep_args(__doc__.split("\n\n")[0], DATA_FILE, argv, extra=weights_option)
    if args.weights:
        best = summarise(json.loads(args.out.read_text())["points"])["selective"]
        saved = {"command": "python -m attnlab.experiments.selective_copy --weights", "models": []}
        for seed in SEEDS:
            point = PointConfig("selective", best["best_lr"], seed)
            record, model = run_point(point, return_model=True)
            saved["models"].append({"point": asdict(point), "record": record,
                                    "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()}})
            print(f"seed {seed}: test accuracy {record['test_acc']:.4f}")
        target = args.out.with_name(WEIGHTS_FILE)
        torch.save(saved, target)
        print(f"wrote {target}")
        return
    if args.smoke:
        points = [PointConfig(arm, 1e-2, steps=20, n_val=64, n_test=64) for arm in ARMS]
    else:
        points = [PointConfig(arm, lr, s) for arm in ARMS for lr in LRS for s in SEEDS]
    command = "python -m attnlab.experiments.selective_copy" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]) if a != "--resume")
    head = _sweep.header(command, arms=list(ARMS), lrs=list(LRS), seeds=list(SEEDS), task=TASK,
                         selection="highest mean validation accuracy", val_seed=VAL_SEED, test_seed=TEST_SEED)
    result = _sweep.run_points(points, run_point, key=_key, head=head,
                               out=None if args.smoke else args.out, resume=args.resume,
                               progress=False, desc="selective copy")
    for arm, row in summarise(result["points"]).items():
        print(arm, {k: v for k, v in row.items() if k != "delta"})
    if not args.smoke:
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
