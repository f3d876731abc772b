"""Mixture of experts: a top-k router, expert feed-forward networks, and the Switch balancing loss.

Read alongside: Shazeer et al. 2017, "Outrageously Large Neural Networks: The Sparsely-Gated
Mixture-of-Experts Layer" (top-k gating); Fedus, Zoph and Shazeer 2022, "Switch Transformers"
(§2.2, the auxiliary load-balancing loss, equation 4); Jiang et al. 2024, "Mixtral of Experts"
(top-2 of 8); Lieber et al. 2024, "Jamba" (top-2 of 16 in every other layer).

Shape letters (see the package docstring):

    b        batch
    L        sequence length
    T        tokens routed together, T = b L
    E        number of experts
    k        experts chosen per token (top-k)
    d_model  width of the residual stream
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import _checks
from .blocks import FeedForward


def switch_load_balancing_loss(probs: torch.Tensor, expert_index: torch.Tensor, n_experts: int) -> torch.Tensor:
    r"""The Switch Transformer's auxiliary loss (Fedus et al. 2022, equation 4), without its weight α.

    .. math:: \mathcal L_\text{aux} = E \sum_{i=1}^{E} f_i\, P_i, \qquad
              f_i = \frac{1}{T k}\sum_{t}\sum_{j<k} \mathbb 1[e_{t,j} = i], \qquad
              P_i = \frac1T \sum_t p_i(x_t)

    f_i is the fraction of routing slots sent to expert i (not differentiable), P_i the mean
    router probability of expert i (differentiable). It equals 1 when both are uniform. With
    top-k routing every f_i is at most 1/k, so its largest value is E/k, reached when every
    token is sent to the same k experts and one of them takes all the probability (E for
    top-1). Minimising it pushes towards balance. The model's loss adds α times it; Switch used α = 10⁻², Jamba's
    released configuration 10⁻³.

    Args: probs (T, E) router softmax; expert_index (T, k) chosen experts. Returns a scalar.
    """
    if probs.dim() != 2 or probs.shape[-1] != n_experts:
        raise ValueError(f"probs must be (T, E={n_experts}), got {tuple(probs.shape)}")
    if expert_index.dim() != 2 or expert_index.shape[0] != probs.shape[0]:
        raise ValueError(f"expert_index must be (T={probs.shape[0]}, k), got {tuple(expert_index.shape)}")
    return n_experts * (expert_load(expert_index, n_experts) * probs.mean(0)).sum()


def expert_load(expert_index: torch.Tensor, n_experts: int) -> torch.Tensor:
    r"""Fraction of routing slots each expert receives, :math:`f_i`: expert_index (T, k) → (E,), sums to 1."""
    if expert_index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"expert_load: expert_index must hold integer expert ids, got {expert_index.dtype}")
    if expert_index.numel() and (expert_index.min() < 0 or expert_index.max() >= n_experts):
        raise ValueError(f"expert_load: expert_index must lie in [0, n_experts={n_experts}), "
                         f"got ids {expert_index.min().item()}..{expert_index.max().item()}")
    counts = torch.bincount(expert_index.reshape(-1), minlength=n_experts).to(torch.get_default_dtype())
    return counts / max(expert_index.numel(), 1)


class TopKRouter(nn.Module):
    r"""Top-k gating: :math:`p = \mathrm{softmax}(x W_g)`, keep the k largest.

    .. math:: \mathrm{MoE}(x) = \sum_{i \in \mathrm{TopK}(p(x))} p_i(x)\, f_i(x)

    The kept probabilities are the gate weights (not renormalised: with k = 1 a renormalised
    weight would be exactly 1 and the router would get no gradient from the task loss).
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int = 2):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be between 1 and n_experts={n_experts}, got {top_k}")
        self.n_experts, self.top_k = n_experts, top_k
        self.gate = nn.Linear(d_model, n_experts, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (T, d_model) → probs (T, E), weights (T, k), expert_index (T, k)."""
        probs = F.softmax(self.gate(x), dim=-1)
        weights, expert_index = probs.topk(self.top_k, dim=-1)
        return probs, weights, expert_index


class MoEFeedForward(nn.Module):
    r"""A feed-forward layer of E experts, k of them active per token: (b, L, d_model) → (b, L, d_model).

    After each forward, ``aux_loss`` holds :func:`switch_load_balancing_loss` of that batch and
    ``load`` the fraction of routing slots each expert received. Parameters: E times a dense
    feed-forward network plus the router's d_model · E; per token only k experts run, so the
    *active* feed-forward parameters are k/E of the experts'.
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int = 2, activation: str = "gelu"):
        super().__init__()
        self.router = TopKRouter(d_model, n_experts, top_k)
        self.experts = nn.ModuleList(FeedForward(d_model, d_ff, activation=activation) for _ in range(n_experts))
        self.aux_loss = torch.zeros(())
        self.load = torch.full((n_experts,), 1.0 / n_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d_model = self.router.gate.in_features
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != d_model:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"MoEFeedForward: x must be (..., d_model={d_model}), got {got}")
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        probs, weights, expert_index = self.router(tokens)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token, slot = (expert_index == e).nonzero(as_tuple=True)
            if token.numel():
                out.index_add_(0, token, weights[token, slot].unsqueeze(-1) * expert(tokens[token]))
        self.aux_loss = switch_load_balancing_loss(probs, expert_index, self.router.n_experts)
        self.load = expert_load(expert_index.detach(), self.router.n_experts)
        return out.reshape(shape)


def load_entropy(load: torch.Tensor) -> float:
    r"""Entropy of an expert-load distribution in bits, :math:`-\sum_i f_i \log_2 f_i`: log₂E when balanced, 0 when collapsed."""
    f = load[load > 0]
    return float(-(f * f.log2()).sum())


def toy_routing_run(aux_weight: float, *, n_experts: int = 8, top_k: int = 1, steps: int = 300, batch: int = 256,
                    lr: float = 1e-2, seed: int = 0, record_every: int = 10, in_dim: int = 16) -> dict:
    r"""Train a tiny MoE regressor and record how its router spreads the tokens, from initialisation on.

    Model: Linear(in_dim, 16) → :class:`MoEFeedForward` (E experts, d_ff = 32, top-k) → Linear(16, 1);
    inputs :math:`x \sim \mathcal N(0, 1.5^2 I_{in\_dim})`, target
    :math:`y = \sin 3x_1 \cos 2x_2 + x_1 x_2 / 2` (the other coordinates are distractors);
    Adam, loss = MSE + ``aux_weight`` · :func:`switch_load_balancing_loss`. With in_dim = 16 the
    router sees a full-rank input and starts close to balanced; with in_dim = 2 its logits are
    affine in a 2-d input and several experts own empty regions of the plane before any step.
    4,096 held-out inputs, drawn from their own generator and never trained on, measure the load
    before training and after it. Seeded: the same arguments give the same numbers.

    Returns {"steps", "entropy" (load entropy in bits on the training batch every ``record_every``
    steps), "load_init" and "load" (E,) on the held-out inputs before and after training, "mse"
    on them after training}.
    """
    _checks.ints("toy_routing_run", n_experts=n_experts, top_k=top_k, steps=steps, batch=batch,
                 record_every=record_every, in_dim=in_dim)
    _checks.ints("toy_routing_run", seed=seed, minimum=0)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    held_out = 1.5 * torch.randn(4096, in_dim, generator=torch.Generator().manual_seed(10_000 + seed))
    model = nn.Sequential(nn.Linear(in_dim, 16), MoEFeedForward(16, 32, n_experts, top_k), nn.Linear(16, 1))
    moe = model[1]
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def target(x):
        return torch.sin(3 * x[:, 0]) * torch.cos(2 * x[:, 1]) + 0.5 * x[:, 0] * x[:, 1]

    with torch.no_grad():
        model(held_out.unsqueeze(0))
    load_init = moe.load.clone()
    recorded_steps, entropy = [], []
    for step in range(1, steps + 1):
        x = 1.5 * torch.randn(batch, in_dim, generator=g)
        loss = F.mse_loss(model(x.unsqueeze(0)).reshape(-1), target(x)) + aux_weight * moe.aux_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % record_every == 0 or step == 1:
            recorded_steps.append(step)
            entropy.append(load_entropy(moe.load))
    with torch.no_grad():
        mse = F.mse_loss(model(held_out.unsqueeze(0)).reshape(-1), target(held_out)).item()
    return {"steps": recorded_steps, "entropy": entropy, "load_init": load_init, "load": moe.load.clone(), "mse": mse}


def moe_model_parameters(*, n_layers: int, n_dense_layers: int, d_model: int, d_ff_dense: int, d_ff_expert: int,
                         n_routed: int, n_shared: int, top_k: int, attention_per_layer: int, vocab: int,
                         tied_embeddings: bool = False) -> dict[str, int]:
    r"""Total and active (per token) weights of a decoder with fine-grained MoE feed-forward layers.

    Every layer has attention (``attention_per_layer`` weights, e.g. :func:`attnlab.mla.mla_parameters`)
    and two RMSNorm gains; the first ``n_dense_layers`` have a dense SwiGLU FFN of width
    ``d_ff_dense``; the others ``n_routed`` routed and ``n_shared`` shared SwiGLU experts of width
    ``d_ff_expert`` and a router (``n_routed`` × d). A token uses the shared experts and ``top_k`` routed ones:

    .. math:: N_{active} = N_{total} - L_{moe}\,(n_{routed} - k)\,3\,d\,d_{ff}^{expert}
    """
    from .hybrid import ffn_parameters

    if not 0 <= n_dense_layers <= n_layers or not 0 < top_k <= n_routed:
        raise ValueError(f"moe_model_parameters: need 0 <= n_dense_layers <= n_layers and 0 < top_k <= n_routed, "
                         f"got {n_dense_layers}, {n_layers}, {top_k}, {n_routed}")
    expert = ffn_parameters(d_model, d_ff_expert)
    moe_layers = n_layers - n_dense_layers
    embeddings = vocab * d_model * (1 if tied_embeddings else 2)
    total = (n_layers * (attention_per_layer + 2 * d_model) + n_dense_layers * ffn_parameters(d_model, d_ff_dense)
             + moe_layers * ((n_routed + n_shared) * expert + n_routed * d_model) + embeddings + d_model)
    active = total - moe_layers * (n_routed - top_k) * expert
    return {"total": total, "active": active, "expert": expert, "moe layers": moe_layers, "embeddings": embeddings}
