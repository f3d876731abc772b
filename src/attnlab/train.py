"""One small training loop, used by every chapter that trains a model.

AdamW with linear warmup and cosine decay (``attnlab.schedules``), gradient clipping, a
``tqdm.auto`` progress bar, periodic evaluation and optional early stopping. The loop knows
nothing about the task: a ``batch_fn(step)`` hands it ``(inputs, targets)``, a ``loss_fn``
turns model, inputs and targets into a scalar loss.

    history = train(model, lambda step: corpus.batch(32, 64), steps=500, lr=3e-3)
    history.loss[-1], history.evals[-1]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from .schedules import warmup_cosine_lr

Batch = tuple[torch.Tensor, torch.Tensor]


def next_token_loss(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of logits ``model(inputs)`` (b, L, V) against ``targets`` (b, L); -100 is ignored."""
    logits = model(inputs)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"next_token_loss: targets must have shape {tuple(logits.shape[:-1])} (the logits' "
                         f"(b, L)), got {tuple(targets.shape)}")
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


@dataclass
class History:
    """What a run recorded: the loss at every step and the evaluations at ``eval_every`` steps."""

    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)  # each has "step" plus whatever eval_fn returned
    stopped_early: bool = False

    def eval_series(self, key: str) -> tuple[list[int], list[float]]:
        """The steps and values of one evaluated metric, for plotting."""
        rows = [e for e in self.evals if key in e]
        return [e["step"] for e in rows], [e[key] for e in rows]


def train(model: torch.nn.Module, batch_fn: Callable[[int], Batch], *, steps: int, lr: float = 1e-3,
          weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.95), warmup: int = 0,
          final_lr_fraction: float = 0.1, grad_clip: float | None = 1.0,
          loss_fn: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] = next_token_loss,
          eval_fn: Callable[[torch.nn.Module], dict] | None = None, eval_every: int = 0,
          stop_when: Callable[[dict], bool] | None = None, seed: int | None = 0,
          progress: bool = True, description: str = "training") -> History:
    """Train ``model`` in place for at most ``steps`` AdamW steps and return its :class:`History`.

    Args:
        batch_fn: ``step -> (inputs, targets)``, already on the model's device.
        lr: peak learning rate, reached after ``warmup`` steps, then cosine-decayed to
            ``final_lr_fraction * lr`` at ``steps``.
        weight_decay: AdamW's decoupled decay, applied to matrices only (not to biases, norms
            or other one-dimensional parameters), as in GPT-2 and nanoGPT, and not to a
            parameter marked ``p._no_weight_decay = True`` (Mamba's A_log, as in its reference code).
        eval_fn: ``model -> {name: float}``, called in ``torch.no_grad`` and eval mode every
            ``eval_every`` steps and after the last step.
        stop_when: called with each evaluation; returning True ends training early.
        seed: seeds torch before the first step (None leaves the generator alone).
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if eval_every < 0:
        raise ValueError(f"eval_every must be >= 0 (0 evaluates only at the end), got {eval_every}")
    if seed is not None:
        torch.manual_seed(seed)
    exempt = lambda p: p.dim() < 2 or getattr(p, "_no_weight_decay", False)
    decay = [p for p in model.parameters() if p.requires_grad and not exempt(p)]
    no_decay = [p for p in model.parameters() if p.requires_grad and exempt(p)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas)
    history = History()
    bar = _progress(steps, description, progress)

    def evaluate(step: int) -> bool:
        if eval_fn is None:
            return False
        model.eval()
        with torch.no_grad():
            metrics = {"step": step, **eval_fn(model)}
        model.train()
        history.evals.append(metrics)
        return stop_when is not None and stop_when(metrics)

    model.train()
    for step in range(1, steps + 1):
        step_lr = warmup_cosine_lr(step, peak=lr, warmup=warmup, total=steps, final=final_lr_fraction * lr)
        for group in optimizer.param_groups:
            group["lr"] = step_lr
        inputs, targets = batch_fn(step)
        loss = loss_fn(model, inputs, targets)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {loss.item()} at step {step}; lower lr (got {lr})")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        history.steps.append(step)
        history.loss.append(loss.item())
        history.lr.append(step_lr)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        last = step == steps
        if (eval_every and step % eval_every == 0) or last:
            if evaluate(step) and not last:
                history.stopped_early = True
                break
    if bar is not None:
        bar.close()
    model.eval()
    return history


def _progress(total: int, description: str, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, leave=False)
