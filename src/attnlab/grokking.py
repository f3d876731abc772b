"""Grokking on modular addition: memorise first, generalise much later, and why.

Read alongside: Power et al. 2022, "Grokking: Generalization Beyond Overfitting on Small
Algorithmic Datasets" (the phenomenon); Nanda et al. 2023, "Progress Measures for Grokking via
Mechanistic Interpretability" (the mechanism: a few discrete Fourier frequencies of Z_p,
cleaned up by weight decay); Liu et al. 2023, "Omnigrok" (weight norm and grokking);
Gromov 2023, "Grokking Modular Arithmetic" (the same Fourier solution in an MLP).

Shapes:
    p        the modulus; tokens are the residues 0 .. p-1
    b        batch of pairs (a, b), inputs (b, 2) long, logits (b, p)
    d_embed  embedding width; the embedding table is (p, d_embed)
    K        number of Fourier frequencies, K = p // 2 + 1 (frequency 0 is the constant)

The precomputed paper-sized run ships as package data (``attnlab/data/grokking_full.json``)
and is regenerated with ``python -m attnlab.grokking --full --seed 0``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import resources

import torch
import torch.nn.functional as F
from torch import nn

from .tasks import ModularAddition, modular_addition
from .train import train

FULL_RUN_COMMAND = "python -m attnlab.grokking --full --seed 0"


class ModularMLP(nn.Module):
    r"""An embedding MLP for :math:`(a, b) \mapsto (a + b) \bmod p`.

    .. math:: \mathrm{logits}(a, b) = W_2\,\mathrm{ReLU}\big(W_1 [E_a; E_b] + b_1\big) + b_2

    One embedding table E (p, d_embed) serves both operands, so its Fourier spectrum over the
    token axis (:func:`fourier_power`) shows which frequencies the network uses.
    """

    def __init__(self, p: int, d_embed: int = 128, width: int = 512):
        super().__init__()
        self.p = p
        self.embed = nn.Embedding(p, d_embed)
        self.hidden = nn.Linear(2 * d_embed, width)
        self.unembed = nn.Linear(width, p)

    def forward(self, pairs: torch.Tensor) -> torch.Tensor:
        """pairs: (b, 2) long in [0, p) -> logits (b, p)."""
        if pairs.dim() != 2 or pairs.shape[-1] != 2:
            raise ValueError(f"pairs must have shape (b, 2), got {tuple(pairs.shape)}")
        e = self.embed(pairs).flatten(1)                       # (b, 2 d_embed)
        return self.unembed(F.relu(self.hidden(e)))


def fourier_power(embedding: torch.Tensor) -> torch.Tensor:
    r"""Fraction of an embedding table's energy at each frequency of :math:`\mathbb Z_p`.

    .. math:: \hat E_k = \sum_{t=0}^{p-1} E_t\, e^{-2\pi i k t / p}, \qquad
              P_k \propto c_k \lVert \hat E_k \rVert^2,\quad \textstyle\sum_k P_k = 1

    with :math:`c_k = 2` where frequencies k and p - k are folded together (Parseval) and 1
    otherwise. embedding: (p, d_embed) -> (K,) with K = p // 2 + 1; entry 0 is the constant.
    """
    if embedding.dim() != 2:
        raise ValueError(f"embedding must have shape (p, d_embed), got {tuple(embedding.shape)}")
    p = embedding.shape[0]
    coeffs = torch.fft.rfft(embedding.detach().double(), dim=0)          # (K, d_embed)
    power = coeffs.abs().square().sum(-1)
    fold = torch.full_like(power, 2.0)
    fold[0] = 1.0
    if p % 2 == 0:
        fold[-1] = 1.0
    power = fold * power
    return power / power.sum()


def fourier_sparsity(embedding: torch.Tensor, top: int = 5) -> float:
    r"""Share of the non-constant energy in the ``top`` strongest frequencies of an embedding (p, d_embed).

    About top / (K - 1) for a random table (energy spread evenly); 1 for a table built from
    ``top`` frequencies. See :func:`top_share`.
    """
    return top_share(fourier_power(embedding), top)


def top_share(power: torch.Tensor, top: int = 5) -> float:
    r"""Share of the non-constant energy of a power spectrum (K,), as :func:`fourier_power` returns
    it, in its ``top`` strongest frequencies:

    .. math:: s_{\mathrm{top}} = \frac{\sum_{k \in \text{top}} P_k}{\sum_{k \ge 1} P_k}
    """
    power = power[1:]
    if not 1 <= top <= power.numel():
        raise ValueError(f"top must be between 1 and {power.numel()}, got {top}")
    return float(power.topk(top).values.sum() / power.sum())


def key_frequencies(embedding: torch.Tensor, top: int = 5) -> list[int]:
    """The ``top`` strongest non-constant frequencies k (1 <= k <= p // 2), strongest first."""
    power = fourier_power(embedding)[1:]
    if not 1 <= top <= power.numel():
        raise ValueError(f"key_frequencies: top must be between 1 and {power.numel()}, got {top}")
    return [int(k) + 1 for k in power.topk(top).indices]


@dataclass
class GrokkingConfig:
    """One grokking run: the task, the MLP, and AdamW's settings (full-batch training)."""

    p: int = 59
    train_fraction: float = 0.5
    d_embed: int = 64
    width: int = 256
    steps: int = 1000
    lr: float = 3e-3
    weight_decay: float = 3.0
    betas: tuple[float, float] = (0.9, 0.98)
    eval_every: int = 25
    seed: int = 0


# The source's setting (p = 97, 30 % of the pairs for training), with Nanda et al.'s optimiser
# (AdamW, lr 1e-3, weight decay 1, betas 0.9/0.98) and a wider MLP: tens of minutes on one CPU core
# (the data file records the wall time of the run that made it).
FULL_CONFIG = GrokkingConfig(p=97, train_fraction=0.3, d_embed=128, width=512, steps=15_000, lr=1e-3,
                             weight_decay=1.0, eval_every=100)


@dataclass
class GrokkingRun:
    """Curves recorded every ``eval_every`` steps (and after the last), and the trained model."""

    config: GrokkingConfig
    steps: list[int] = field(default_factory=list)
    train_acc: list[float] = field(default_factory=list)
    val_acc: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    weight_norm: list[float] = field(default_factory=list)   # sqrt of the sum of squared weights
    sparsity: list[float] = field(default_factory=list)      # fourier_sparsity(E, top=5)
    spectra: list[list[float]] = field(default_factory=list)  # fourier_power(E) at each evaluation
    model: ModularMLP | None = None

    def first_step(self, series: str, threshold: float) -> int | None:
        """The first evaluated step where ``series`` (e.g. "val_acc") reaches ``threshold``."""
        return next((s for s, v in zip(self.steps, getattr(self, series)) if v >= threshold), None)


def _metrics(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    logits = model(inputs)
    return (logits.argmax(-1) == targets).double().mean().item(), F.cross_entropy(logits, targets).item()


def run_grokking(config: GrokkingConfig = GrokkingConfig(), *, device: str | torch.device = "cpu",
                 progress: bool = True, on_eval=None) -> GrokkingRun:
    """Train a :class:`ModularMLP` on (a + b) mod p with :func:`attnlab.train.train`, full batch.

    Constant learning rate after 10 warm-up steps; weight decay on matrices (the embedding too).
    Every ``eval_every`` steps it records train/validation accuracy and loss, the weight norm,
    and the embedding's Fourier spectrum; ``on_eval(run, model)``, if given, is then called
    (the command line uses it to save partial curves of a long run).
    """
    data: ModularAddition = modular_addition(config.p, config.train_fraction, seed=config.seed)
    torch.manual_seed(config.seed)
    model = ModularMLP(config.p, config.d_embed, config.width).to(device)
    x_train, y_train = data.train_inputs.to(device), data.train_targets.to(device)
    x_val, y_val = data.val_inputs.to(device), data.val_targets.to(device)
    run = GrokkingRun(config)

    def evaluate(m: nn.Module) -> dict:
        train_acc, train_loss = _metrics(m, x_train, y_train)
        val_acc, val_loss = _metrics(m, x_val, y_val)
        norm = math.sqrt(sum(p.detach().square().sum().item() for p in m.parameters()))
        for key, value in (("train_acc", train_acc), ("val_acc", val_acc), ("train_loss", train_loss),
                           ("val_loss", val_loss), ("weight_norm", norm),
                           ("sparsity", fourier_sparsity(m.embed.weight, top=5))):
            getattr(run, key).append(value)
        run.spectra.append(fourier_power(m.embed.weight).tolist())
        run.steps.append(min((len(run.steps) + 1) * config.eval_every, config.steps))
        if on_eval is not None:
            on_eval(run, m)
        return {"train_acc": train_acc, "val_acc": val_acc}

    train(model, lambda step: (x_train, y_train), steps=config.steps, lr=config.lr,
          weight_decay=config.weight_decay, betas=config.betas, warmup=10, final_lr_fraction=1.0,
          loss_fn=lambda m, x, y: F.cross_entropy(m(x), y), eval_fn=evaluate,
          eval_every=config.eval_every, seed=config.seed, progress=progress,
          description=f"grokking mod {config.p}")
    run.model = model
    return run


def run_to_dict(run: GrokkingRun, *, command: str, seconds: float, complete: bool = True) -> dict:
    """A JSON-ready record of a run: the command and seed that made it, its config and curves."""
    record = {"command": command, "seed": run.config.seed, "config": asdict(run.config),
              "torch": torch.__version__, "wall_seconds": round(seconds, 1), "complete": complete}
    for key in ("steps", "train_acc", "val_acc", "train_loss", "val_loss", "weight_norm", "sparsity", "spectra"):
        values = getattr(run, key)
        record[key] = [[round(v, 6) for v in row] for row in values] if key == "spectra" else \
            [v if isinstance(v, int) else round(v, 6) for v in values]
    record["key_frequencies"] = key_frequencies(run.model.embed.weight) if run.model is not None else []
    return record


def load_full_run() -> dict:
    """The precomputed paper-sized run (package data), with the ``command`` that regenerates it."""
    text = resources.files("attnlab").joinpath("data/grokking_full.json").read_text()
    return json.loads(text)


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m attnlab.grokking [--full] [--seed S] [--out PATH]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the paper-sized run (FULL_CONFIG)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON file to write (default: stdout)")
    args = parser.parse_args(argv)
    base = FULL_CONFIG if args.full else GrokkingConfig()
    config = GrokkingConfig(**{**asdict(base), "seed": args.seed})
    command = "python -m attnlab.grokking" + (" --full" if args.full else "") + f" --seed {args.seed}"
    start = time.perf_counter()

    def save(run: GrokkingRun, complete: bool) -> None:
        text = json.dumps(run_to_dict(run, command=command, seconds=time.perf_counter() - start, complete=complete))
        if args.out is None:
            sys.stdout.write(text + "\n")
        else:
            with open(args.out, "w") as handle:
                handle.write(text + "\n")

    def save_partial(run: GrokkingRun, model: nn.Module) -> None:
        if args.out is not None and len(run.steps) % 10 == 0:
            run.model = model
            save(run, complete=False)

    save(run_grokking(config, progress=sys.stderr.isatty(), on_eval=save_partial), complete=True)


if __name__ == "__main__":
    main()
