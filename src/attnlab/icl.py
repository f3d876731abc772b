"""In-context learning as an algorithm: linear self-attention that runs gradient descent.

Read alongside: von Oswald et al. 2023, "Transformers Learn In-Context by Gradient Descent"
(the construction here); Akyürek et al. 2023, "What Learning Algorithm Is In-Context
Learning?" (ridge regression, closed form); Xie et al. 2022 (in-context learning as implicit
Bayesian inference, a different explanation).

Tokens are e_i = (x_i, y_i) in R^{d+1} for the N context examples and e_q = (x_test, 0) for the
query; shapes (b, N + 1, d + 1), the query last.
"""
from __future__ import annotations

import torch

from . import _checks
from .tasks import RegressionPrompts


def _check_prompts(fn: str, prompts) -> None:
    if not isinstance(prompts, RegressionPrompts):
        raise TypeError(f"{fn}: prompts must be a RegressionPrompts (attnlab.tasks.in_context_regression), "
                        f"got {type(prompts).__name__}")


def prompt_tokens(prompts: RegressionPrompts) -> torch.Tensor:
    """Stack the context pairs and the query (its y slot 0) into tokens (b, N + 1, d + 1)."""
    _check_prompts("prompt_tokens", prompts)
    context = torch.cat([prompts.x, prompts.y.unsqueeze(-1)], dim=-1)
    query = torch.cat([prompts.x_test, torch.zeros_like(prompts.y_test).unsqueeze(-1)], dim=-1)
    return torch.cat([context, query.unsqueeze(1)], dim=1)


def linear_self_attention(tokens: torch.Tensor, w_kq: torch.Tensor, w_pv: torch.Tensor) -> torch.Tensor:
    r"""One residual linear self-attention layer (no softmax), keys and values from the context only.

    .. math:: e_j \leftarrow e_j + \frac1N \sum_{i=1}^{N} (W_{PV} e_i)\,(e_i^\top W_{KQ} e_j)

    tokens: (b, N + 1, d + 1), the query last; w_kq, w_pv: (d + 1, d + 1).
    """
    if tokens.dim() != 3 or tokens.shape[1] < 2:
        raise ValueError(f"linear_self_attention: tokens must be (b, N + 1, d + 1) with N >= 1, "
                         f"got {tuple(tokens.shape)}")
    width = tokens.shape[-1]
    for name, w in (("w_kq", w_kq), ("w_pv", w_pv)):
        if w.shape != (width, width):
            raise ValueError(f"linear_self_attention: {name} must be (d + 1, d + 1) = ({width}, {width}), "
                             f"got {tuple(w.shape)}")
    context = tokens[:, :-1]
    n = context.shape[1]
    scores = context @ w_kq @ tokens.transpose(1, 2)             # (b, N, N + 1): e_iᵀ W_KQ e_j
    return tokens + (scores.transpose(1, 2) @ (context @ w_pv.T)) / n


def gd_weights(d: int, eta: float, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """von Oswald et al.'s weights: W_KQ reads x·x', W_PV writes -η y into the y slot."""
    _checks.ints("gd_weights", d=d)
    w_kq = torch.zeros(d + 1, d + 1, dtype=dtype)
    w_kq[:d, :d] = torch.eye(d, dtype=dtype)
    w_pv = torch.zeros(d + 1, d + 1, dtype=dtype)
    w_pv[d, d] = -eta
    return w_kq, w_pv


def gd_predictions(prompts: RegressionPrompts, eta, steps: int) -> torch.Tensor:
    r"""Predictions for x_test after 1..steps of gradient descent from w = 0, (steps, b).

    Loss :math:`\frac{1}{2N}\sum_i (w\cdot x_i - y_i)^2`, update
    :math:`w \leftarrow w - \eta_k \nabla L` at step k. ``eta``: one step size for every
    step, or a sequence of ``steps`` step sizes (a per-step schedule).
    """
    _check_prompts("gd_predictions", prompts)
    _checks.ints("gd_predictions", steps=steps)
    etas = [float(eta)] * steps if isinstance(eta, (int, float)) else [float(e) for e in eta]
    if len(etas) != steps:
        raise ValueError(f"eta must be a number or a sequence of steps={steps} step sizes, "
                         f"got {len(etas)}")
    x, y = prompts.x, prompts.y
    w = torch.zeros_like(prompts.x_test)
    out = []
    for eta_k in etas:
        residual = torch.einsum("bnd,bd->bn", x, w) - y
        w = w - eta_k * torch.einsum("bn,bnd->bd", residual, x) / x.shape[1]
        out.append((w * prompts.x_test).sum(-1))
    return torch.stack(out)


def ridge_prediction(prompts: RegressionPrompts, lam: float) -> torch.Tensor:
    r"""The ridge-regression prediction :math:`x_{test}^\top (X^\top X + \lambda I)^{-1} X^\top y`, (b,)."""
    _check_prompts("ridge_prediction", prompts)
    x, y = prompts.x, prompts.y
    gram = x.transpose(1, 2) @ x + lam * torch.eye(x.shape[-1], dtype=x.dtype)
    w = torch.linalg.solve(gram, (x.transpose(1, 2) @ y.unsqueeze(-1))).squeeze(-1)
    return (w * prompts.x_test).sum(-1)


class LinearSelfAttentionStack(torch.nn.Module):
    r"""K trainable layers of :func:`linear_self_attention`, read out as the query's y slot.

    .. math:: \hat y = -\big(e_q^{(K)}\big)_{y}, \qquad
              e_j^{(k)} = e_j^{(k-1)} + \frac1N \sum_{i=1}^{N} W_{PV}^{(k)} e_i^{(k-1)}\,
              \big(e_i^{(k-1)\top} W_{KQ}^{(k)} e_j^{(k-1)}\big)

    Each layer has its own W_KQ, W_PV (d + 1, d + 1), drawn N(0, init_scale^2): nothing of
    :func:`gd_weights` is built in. tokens (b, N + 1, d + 1) -> predictions (b,).
    """

    def __init__(self, d: int, n_layers: int = 1, init_scale: float = 0.01):
        super().__init__()
        self.w_kq = torch.nn.Parameter(init_scale * torch.randn(n_layers, d + 1, d + 1))
        self.w_pv = torch.nn.Parameter(init_scale * torch.randn(n_layers, d + 1, d + 1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 3 or tokens.shape[-1] != self.w_kq.shape[-1]:
            raise ValueError(f"tokens must have shape (b, N + 1, d + 1 = {self.w_kq.shape[-1]}), "
                             f"got {tuple(tokens.shape)}")
        for w_kq, w_pv in zip(self.w_kq, self.w_pv):
            tokens = linear_self_attention(tokens, w_kq, w_pv)
        return -tokens[:, -1, -1]


def effective_step_size(w_kq: torch.Tensor, w_pv: torch.Tensor) -> tuple[float, float]:
    r"""Read a trained layer as gradient descent: the step size it takes, and how far it is from GD.

    With the query's y slot 0, one layer predicts
    :math:`\hat y = -\frac1N \sum_i (W_{PV} e_i)_y\,(e_i^\top W_{KQ} e_q)`. The product
    :math:`M = (W_{PV})_{y,y}\,(W_{KQ})_{x,x}` (d, d) gives the term
    :math:`-\frac1N \sum_i y_i\, x_i^\top M x_q`, one GD step when :math:`M = -\eta I`. The x part
    of the y row of each matrix, :math:`(W_{PV})_{y,x}` and :math:`(W_{KQ})_{y,x}` (``w_pv[d, :d]``
    and ``w_kq[d, :d]``), adds further terms. GD's construction has them zero, and this reading
    holds only where they are (near) zero, which the caller must check. Returns
    :math:`\eta = -\mathrm{tr} M / d` and the relative distance
    :math:`\lVert M + \eta I \rVert_F / \lVert M \rVert_F` (0 for exact GD).
    """
    if w_kq.dim() != 2 or w_kq.shape[0] != w_kq.shape[1] or w_kq.shape[0] < 2 or w_pv.shape != w_kq.shape:
        raise ValueError(f"effective_step_size: w_kq and w_pv must both be (d + 1, d + 1) with d >= 1, "
                         f"got {tuple(w_kq.shape)} and {tuple(w_pv.shape)}")
    d = w_kq.shape[-1] - 1
    m = w_pv[d, d] * w_kq[:d, :d]
    eta = -torch.trace(m) / d
    return float(eta), float(torch.linalg.norm(m + eta * torch.eye(d, dtype=m.dtype)) / torch.linalg.norm(m))
