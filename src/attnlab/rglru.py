"""Griffin's real-gated linear recurrent unit (RG-LRU) and its recurrent block.

Read alongside: De et al. 2024, "Griffin: Mixing Gated Linear Recurrences with Local Attention
for Efficient Language Models" (§2.4, equations 1-4, and Figure 2: the recurrent block);
Orvieto et al. 2023, "Resurrecting Recurrent Neural Networks for Long Sequences" (LRU: the
√(1 − a²) input normalisation); Botev et al. 2024, "RecurrentGemma" (the released configuration);
Hillis and Steele 1986 (the doubling scan).

Shape letters (see the package docstring):

    b        batch
    L        sequence length
    d        channels of the recurrence (d_rnn; one scalar state per channel)
    d_model  width of the residual stream around the block

Every channel keeps one number of state, so a layer's state is d numbers (plus the last
conv_width − 1 inputs of its short convolution), whatever the context length.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

RECURRENCE_METHODS = ("loop", "scan")


def _check_recurrence(a: torch.Tensor, x: torch.Tensor) -> None:
    for name, t in (("a", a), ("x", x)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 3 or a.shape != x.shape:
        raise ValueError(f"a and x must both be (b, L, d); got a {tuple(a.shape)}, x {tuple(x.shape)}")


def linear_recurrence(a: torch.Tensor, x: torch.Tensor, *, method: str = "loop") -> torch.Tensor:
    r"""The diagonal linear recurrence :math:`h_t = a_t \odot h_{t-1} + x_t`, :math:`h_{-1} = 0`.

    * ``"loop"``: one step per token (the reference; what decoding does);
    * ``"scan"``: the doubling (Hillis-Steele) scan. A step of the recurrence is the affine map
      :math:`h \mapsto a_t h + x_t`; two of them compose as
      :math:`(a_2, x_2) \circ (a_1, x_1) = (a_2 a_1,\; a_2 x_1 + x_2)`, which is associative, so
      after rounds with offsets 1, 2, 4, … every position holds the composition of all the steps
      up to it: ⌈log₂ L⌉ vectorised rounds instead of L Python steps. Only products of decays
      appear, never their inverses, so nothing overflows.

    Args: a, x (b, L, d). Returns h (b, L, d).
    """
    _check_recurrence(a, x)
    if method not in RECURRENCE_METHODS:
        raise ValueError(f"method must be one of {RECURRENCE_METHODS}, got {method!r}")
    if method == "loop":
        h, hs = torch.zeros_like(x[:, 0]), []
        for a_t, x_t in zip(a.unbind(1), x.unbind(1)):
            h = a_t * h + x_t
            hs.append(h)
        return torch.stack(hs, dim=1)
    offset = 1
    while offset < x.shape[1]:
        x = torch.cat([x[:, :offset], x[:, offset:] + a[:, offset:] * x[:, :-offset]], dim=1)
        a = torch.cat([a[:, :offset], a[:, offset:] * a[:, :-offset]], dim=1)
        offset *= 2
    return x


def rg_lru(x: torch.Tensor, gate_a: torch.Tensor, gate_x: torch.Tensor, log_a: torch.Tensor, c: float = 8.0, *,
           normalize: bool = True, method: str = "loop") -> torch.Tensor:
    r"""The RG-LRU of Griffin (De et al. 2024, equations 1-4), given its two gates.

    .. math::
        a_t = \sigma(\Lambda)^{c\, r_t} = \exp\big(c\, r_t \log\sigma(\Lambda)\big), \qquad
        h_t = a_t \odot h_{t-1} + \sqrt{1 - a_t^2} \odot (i_t \odot x_t)

    with the recurrence gate :math:`r_t` and input gate :math:`i_t` in (0, 1) and c = 8. The
    decay is computed in log space: :math:`\log a_t = -c\, r_t\, \mathrm{softplus}(-\Lambda)`.
    If the inputs are independent with unit variance, :math:`\mathrm{Var}(h_t) \le 1` for every t;
    without the factor :math:`\sqrt{1-a_t^2}` (``normalize=False``) it tends to
    :math:`1/(1-a^2)`, which is 500 at a = 0.999.

    Args: x, gate_a (r_t), gate_x (i_t): (b, L, d); log_a: (d,) the log of σ(Λ), negative.
    Returns h (b, L, d).
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"rg_lru: x must be (b, L, d), got {tuple(getattr(x, 'shape', ())) or type(x).__name__}")
    for name, gate in (("gate_a", gate_a), ("gate_x", gate_x)):
        if not isinstance(gate, torch.Tensor) or gate.shape != x.shape:
            raise ValueError(f"rg_lru: {name} must have x's shape (b, L, d) = {tuple(x.shape)}, "
                             f"got {tuple(getattr(gate, 'shape', ())) or type(gate).__name__}")
    if log_a.dim() != 1 or log_a.shape[0] != x.shape[-1]:
        raise ValueError(f"log_a must be (d,) = ({x.shape[-1]},), got {tuple(log_a.shape)}")
    log_a_t = c * gate_a * log_a                                            # (b, L, d), ≤ 0
    a_t = log_a_t.exp()
    inputs = gate_x * x
    if normalize:
        inputs = inputs * torch.sqrt(-torch.expm1(2 * log_a_t))              # √(1 − a_t²), accurate as a_t → 1
    return linear_recurrence(a_t, inputs, method=method)


class RGLRU(nn.Module):
    r"""The RG-LRU layer: the gates :math:`r_t = \sigma(W_a x_t + b_a)`, :math:`i_t = \sigma(W_x x_t + b_x)`,
    then :func:`rg_lru`. (b, L, d) → (b, L, d).

    Λ is learned; it is initialised so that :math:`a^c = \sigma(\Lambda)^c` is uniform in
    [0.9, 0.999] (the paper's initialisation). Griffin's gate weights are block-diagonal per
    head; here they are dense, which changes the parameter count, not the recurrence.
    """

    def __init__(self, d: int, c: float = 8.0, *, a_min: float = 0.9, a_max: float = 0.999, method: str = "scan"):
        super().__init__()
        self.c, self.method = c, method
        self.gate_a = nn.Linear(d, d)
        self.gate_x = nn.Linear(d, d)
        a_c = torch.empty(d).uniform_(a_min, a_max)                         # a^c at r = 1
        a = a_c ** (1 / c)
        self.a_param = nn.Parameter(torch.log(a) - torch.log1p(-a))          # Λ = logit(a)

    def log_a(self) -> torch.Tensor:
        """log σ(Λ) = −softplus(−Λ), (d,)."""
        return -F.softplus(-self.a_param)

    def forward(self, x: torch.Tensor, *, method: str | None = None, normalize: bool = True) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.a_param.shape[0]:
            raise ValueError(f"x must be (b, L, d={self.a_param.shape[0]}), got {tuple(x.shape)}")
        return rg_lru(x, torch.sigmoid(self.gate_a(x)), torch.sigmoid(self.gate_x(x)), self.log_a(), self.c,
                      normalize=normalize, method=method or self.method)

    def step(self, x_t: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        r"""One token of the recurrence: x_t, h (b, d) → the new state h_t (b, d), which is also the output.

        .. math:: a_t = \exp(c\, r_t \log\sigma(\Lambda)), \qquad
                  h_t = a_t \odot h_{t-1} + \sqrt{1 - a_t^2} \odot (i_t \odot x_t)
        """
        d = self.a_param.shape[0]
        if x_t.dim() != 2 or x_t.shape[-1] != d or h.shape != x_t.shape:
            raise ValueError(f"RGLRU.step: x_t and h must both be (b, d={d}), got x_t {tuple(x_t.shape)}, "
                             f"h {tuple(h.shape)}")
        log_a_t = self.c * torch.sigmoid(self.gate_a(x_t)) * self.log_a()
        inputs = torch.sigmoid(self.gate_x(x_t)) * x_t * torch.sqrt(-torch.expm1(2 * log_a_t))
        return log_a_t.exp() * h + inputs


class GriffinRecurrentBlock(nn.Module):
    r"""Griffin's recurrent block (De et al. 2024, Figure 2): (b, L, d_model) → (b, L, d_model).

    .. math:: y = W_\text{out}\big(\mathrm{GeLU}(W_1 x) \odot \mathrm{RGLRU}(\mathrm{Conv1D}(W_2 x))\big)

    The Conv1D is causal and depthwise with width 4. There is no normalisation of h before
    the output projection; the block sits inside a pre-norm residual layer.
    """

    def __init__(self, d_model: int, d_rnn: int | None = None, conv_width: int = 4, c: float = 8.0):
        super().__init__()
        d_rnn = d_rnn or d_model
        self.d_model, self.d_rnn, self.conv_width = d_model, d_rnn, conv_width
        self.gate_proj = nn.Linear(d_model, d_rnn)
        self.in_proj = nn.Linear(d_model, d_rnn)
        self.conv1d = nn.Conv1d(d_rnn, d_rnn, conv_width, groups=d_rnn, padding=conv_width - 1)
        self.rglru = RGLRU(d_rnn, c)
        self.out_proj = nn.Linear(d_rnn, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (b, L, d_model={self.d_model}), got {tuple(x.shape)}")
        length = x.shape[1]
        u = self.conv1d(self.in_proj(x).transpose(1, 2))[..., :length].transpose(1, 2)   # causal: drop the tail
        return self.out_proj(F.gelu(self.gate_proj(x)) * self.rglru(u))

    def state_size(self) -> int:
        """Numbers kept per sequence at inference: d_rnn (the state) + d_rnn (conv_width − 1) (the conv)."""
        return self.d_rnn * self.conv_width

    def init_state(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Empty decoding state: the last conv_width − 1 inputs of the convolution (b, d_rnn, conv_width − 1)
        and the recurrence's h (b, d_rnn), zeros, in the weights' dtype."""
        w = self.in_proj.weight
        return w.new_zeros(batch, self.d_rnn, self.conv_width - 1), w.new_zeros(batch, self.d_rnn)

    def step(self, x_t: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        r"""One token: x_t (b, d_model) and the state → (y_t (b, d_model), new state), at a cost that does
        not grow with t. The same computation as :meth:`forward` at the last position:

        .. math:: u_t = \textstyle\sum_{j} w_j\, (W_2 x)_{t-j}, \qquad h_t = \text{RG-LRU step}(u_t, h_{t-1}),
                  \qquad y_t = W_\text{out}\big(\mathrm{GeLU}(W_1 x_t) \odot h_t\big)
        """
        if x_t.dim() != 2 or x_t.shape[-1] != self.d_model:
            raise ValueError(f"GriffinRecurrentBlock.step: x_t must be (b, d_model={self.d_model}), "
                             f"got {tuple(x_t.shape)}")
        conv_state, h = state
        window = torch.cat([conv_state, self.in_proj(x_t).unsqueeze(-1)], dim=-1)     # (b, d_rnn, width)
        u = (window * self.conv1d.weight.squeeze(1)).sum(-1) + self.conv1d.bias
        h = self.rglru.step(u, h)
        return self.out_proj(F.gelu(self.gate_proj(x_t)) * h), (window[..., 1:], h)


def stationary_variance(a: float, normalize: bool = True) -> float:
    r"""Variance of :math:`h_t` as t → ∞ for unit-variance i.i.d. inputs and a constant decay a (gates = 1).

    .. math:: \mathrm{Var}(h_\infty) = (1 - a^2) \sum_{k \ge 0} a^{2k} = 1 \text{ (normalised)}, \qquad
              \sum_{k \ge 0} a^{2k} = \frac{1}{1 - a^2} \text{ (not)}
    """
    if not 0 <= a < 1:
        raise ValueError(f"a must lie in [0, 1), got {a}")
    return 1.0 if normalize else 1.0 / (1.0 - a * a)



def memory_horizon(a: float, eps: float = 0.01) -> int:
    r"""How many steps a token's trace survives in a state that decays by a per step: the smallest
    k with :math:`a^k < \epsilon`,

    .. math:: k = \big\lfloor \ln\epsilon / \ln a \big\rfloor + 1

    For the RG-LRU at :math:`r_t = 1`, a is :math:`\sigma(\Lambda)^c` (0.9 … 0.999 at
    initialisation: 44 … 4,603 steps for ε = 1%); for a Mamba channel :math:`a = e^{\Delta A}`.
    A gate that lowers the decay (r_t → 0, Δ → 0) lengthens it without bound.
    """
    if not 0 <= a < 1:
        raise ValueError(f"memory_horizon: a must lie in [0, 1), got {a}")
    if not 0 < eps < 1:
        raise ValueError(f"memory_horizon: eps must lie in (0, 1), got {eps}")
    if a == 0:
        return 1
    return math.floor(math.log(eps) / math.log(a)) + 1
