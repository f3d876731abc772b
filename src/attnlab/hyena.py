"""The Hyena operator: a gated long convolution, and the filter StripedHyena uses.

Read alongside: Poli et al. 2023, "Hyena Hierarchy: Towards Larger Convolutional Language
Models" (the operator of order N, §3; implicit long filters); Together AI 2023, "StripedHyena-7B"
(release notes: Hyena layers striped with attention, long filters in a modal/state-space form
with a small state, short filters of length 3); Massaroli et al. 2023, "Laughing Hyena
Distillery" (modal filters decode recurrently); Cooley and Tukey 1965 (the FFT).

Shape letters (see the package docstring):

    b        batch
    d        channels (every channel has its own long filter)
    L        sequence length
    s        state size of a modal filter (number of decaying modes)
    d_model  width of the residual stream around the operator

The long filter here is modal: :math:`h_t = \\sum_{k<s} R_k \\lambda_k^t` per channel, i.e. the
impulse response of a diagonal linear time-invariant SSM (chapter 10). So a Hyena layer can be
computed three ways, and :class:`HyenaOperator` exposes all three: an FFT convolution in
O(L log L), a direct causal convolution in O(L²), and a recurrence with s numbers of state per
channel.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import _checks
from .ssm import lti_convolution, lti_recurrence, ssm_kernel

CONV_METHODS = ("fft", "direct", "recurrent")


def causal_conv_direct(u: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    r"""Causal convolution by its definition, the direct sum: O(L²) per channel.

    .. math:: y_t = \sum_{s=0}^{t} h_{t-s}\, u_s, \qquad
              y = T u,\quad T_{ts} = h_{t-s}\ (s \le t),\ 0 \text{ otherwise}

    Computed by a direct (not FFT) depthwise convolution kernel over the input padded with
    L − 1 zeros on the left, which is the product with the Toeplitz matrix :func:`toeplitz`
    without building it: L multiply-adds per output position, as FLOP counters count them.

    Args: u (b, d, L); h (d, L). Returns y (b, d, L).
    """
    if u.dim() != 3 or h.shape != u.shape[1:]:
        raise ValueError(f"u must be (b, d, L) and h (d, L); got u {tuple(u.shape)}, h {tuple(h.shape)}")
    length = u.shape[-1]
    return F.conv1d(F.pad(u, (length - 1, 0)), h.flip(-1).unsqueeze(1), groups=u.shape[1])


def toeplitz(h: torch.Tensor) -> torch.Tensor:
    r"""The lower-triangular Toeplitz matrices :math:`T_{ts} = h_{t-s}` for s ≤ t: h (..., L) → (..., L, L)."""
    if not isinstance(h, torch.Tensor) or h.dim() == 0:
        raise ValueError(f"toeplitz: h must be a tensor of shape (..., L), got {getattr(h, 'shape', type(h).__name__)}")
    length = h.shape[-1]
    lag = torch.arange(length, device=h.device).unsqueeze(-1) - torch.arange(length, device=h.device)
    return torch.where(lag >= 0, h[..., lag.clamp(min=0)], h.new_zeros(()))


class ModalFilter(nn.Module):
    r"""A long filter in modal form: :math:`h_t = \sum_{k<s} R_k\, \lambda_k^{\,t}`, one per channel.

    :math:`\lambda_k = \exp(-e^{\rho_k}) \in (0, 1)` are decay rates, :math:`R_k` residues; rates are
    initialised log-uniformly so that the filters' memories range from a few to about L_max
    steps. The same filter is the kernel of the diagonal SSM with :math:`\bar A = \lambda`,
    :math:`\bar B = 1`, :math:`C = R` (``attnlab.ssm.ssm_kernel``).
    """

    def __init__(self, d: int, state: int = 2, max_memory: float = 256.0):
        super().__init__()
        log_max = float(np.float32(math.log(max_memory)))                       # as float32 log, also on meta
        memory = torch.exp(torch.empty(d, state).uniform_(0.0, log_max))
        self.log_rate = nn.Parameter(torch.log(1.0 / memory))                # λ = exp(−1/memory)
        self.residue = nn.Parameter(torch.randn(d, state) / state ** 0.5)

    def decays(self) -> torch.Tensor:
        """λ (d, s), in (0, 1)."""
        return torch.exp(-self.log_rate.exp())

    def forward(self, length: int) -> torch.Tensor:
        """The filter h (d, L)."""
        lam = self.decays()
        return ssm_kernel(lam, torch.ones_like(lam), self.residue, length)


class HyenaOperator(nn.Module):
    r"""The Hyena operator of order 2 (Poli et al. 2023, §3): (b, L, d_model) → (b, L, d_model).

    .. math::
        (v, x^1, x^2) = \mathrm{ShortConv}(u W_\text{in}), \qquad
        y = x^2 \odot \big(h * (x^1 \odot v) + D \odot x^1 \odot v\big), \qquad \text{out} = y W_\text{out}

    ShortConv is a causal depthwise convolution of length 3 (StripedHyena's short filter); h is
    a :class:`ModalFilter` long filter, one per channel, applied causally. ``method`` chooses
    how the long convolution runs: ``"fft"`` (O(L log L), the default), ``"direct"`` (Toeplitz,
    O(L²)) or ``"recurrent"`` (the modal filter's SSM, s numbers per channel).
    """

    def __init__(self, d_model: int, short_filter: int = 3, filter_state: int = 2, max_memory: float = 256.0,
                 method: str = "fft"):
        super().__init__()
        if method not in CONV_METHODS:
            raise ValueError(f"method must be one of {CONV_METHODS}, got {method!r}")
        self.d_model, self.short_filter, self.method = d_model, short_filter, method
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.short_conv = nn.Conv1d(3 * d_model, 3 * d_model, short_filter, groups=3 * d_model,
                                    padding=short_filter - 1)
        self.filter = ModalFilter(d_model, filter_state, max_memory)
        self.D = nn.Parameter(torch.zeros(d_model))
        self.out_proj = nn.Linear(d_model, d_model)

    def long_conv(self, z: torch.Tensor, method: str | None = None) -> torch.Tensor:
        r"""The long causal convolution :math:`h * z`: z (b, d, L) → (b, d, L)."""
        method = method or self.method
        if method not in CONV_METHODS:
            raise ValueError(f"method must be one of {CONV_METHODS}, got {method!r}")
        if method == "recurrent":
            lam = self.filter.decays()
            return lti_recurrence(z, lam, torch.ones_like(lam), self.filter.residue)
        h = self.filter(z.shape[-1])
        return lti_convolution(z, h) if method == "fft" else causal_conv_direct(z, h)

    def forward(self, u: torch.Tensor, *, method: str | None = None) -> torch.Tensor:
        if u.dim() != 3 or u.shape[-1] != self.d_model:
            raise ValueError(f"u must be (b, L, d_model={self.d_model}), got {tuple(u.shape)}")
        length = u.shape[1]
        proj = self.short_conv(self.in_proj(u).transpose(1, 2))[..., :length]     # (b, 3d, L), causal
        v, x1, x2 = proj.chunk(3, dim=1)
        z = x1 * v
        y = x2 * (self.long_conv(z, method) + self.D.unsqueeze(-1) * z)
        return self.out_proj(y.transpose(1, 2))

    def state_size(self) -> int:
        """Numbers kept per sequence when decoding recurrently: d s (modes) + 3 d (short_filter − 1)."""
        return self.d_model * self.filter.residue.shape[1] + 3 * self.d_model * (self.short_filter - 1)

    def init_state(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Empty decoding state: the last short_filter − 1 projected inputs (b, 3 d_model, short_filter − 1)
        and the modes of the long filter (b, d_model, s), zeros, in the weights' dtype."""
        w = self.in_proj.weight
        return (w.new_zeros(batch, 3 * self.d_model, self.short_filter - 1),
                w.new_zeros(batch, self.d_model, self.filter.residue.shape[1]))

    def step(self, u_t: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        r"""One token: u_t (b, d_model) and the state → (out_t (b, d_model), new state), constant cost per token.

        The long filter :math:`h_t = \sum_k R_k \lambda_k^t` is run as its SSM, one state per mode:

        .. math:: m_t = \lambda \odot m_{t-1} + z_t, \qquad (h * z)_t = \textstyle\sum_k R_k\, m_{t,k},
                  \qquad y_t = x^2_t \odot \big((h * z)_t + D z_t\big), \quad z_t = x^1_t \odot v_t
        """
        if u_t.dim() != 2 or u_t.shape[-1] != self.d_model:
            raise ValueError(f"HyenaOperator.step: u_t must be (b, d_model={self.d_model}), got {tuple(u_t.shape)}")
        conv_state, modes = state
        window = torch.cat([conv_state, self.in_proj(u_t).unsqueeze(-1)], dim=-1)       # (b, 3d, short_filter)
        proj = (window * self.short_conv.weight.squeeze(1)).sum(-1) + self.short_conv.bias
        v, x1, x2 = proj.chunk(3, dim=-1)
        z = x1 * v
        modes = self.filter.decays() * modes + z.unsqueeze(-1)
        y = x2 * ((modes * self.filter.residue).sum(-1) + self.D * z)
        return self.out_proj(y), (window[..., 1:], modes)


def conv_flops(length: int, d: int, method: str) -> float:
    r"""Multiply-adds ×2 of a long causal convolution of d channels.

    Direct: :math:`2 d \cdot L(L+1)/2`. FFT (real, padded to 2L): about :math:`3 \cdot 5 d\,(2L)\log_2(2L)/2`
    for two forward transforms and one inverse, plus the pointwise product — :math:`O(d L \log L)`.
    """
    if method not in ("fft", "direct"):
        raise ValueError(f"conv_flops: method must be 'fft' or 'direct', got {method!r}")
    _checks.at_least("conv_flops", 1, length=length)
    _checks.at_least("conv_flops", 0, d=d)
    if method == "direct":
        return float(d * length * (length + 1))
    n = 2 * length
    return float(d * (3 * 2.5 * n * torch.log2(torch.tensor(float(n))).item() + 6 * (n // 2 + 1)))

