r"""A trainable diagonal state space layer (S4D), and the HiPPO-LegS memory behind S4.

Read alongside: Gu, Gupta, Goel and Ré 2022, "On the Parameterization and
Initialization of Diagonal State Space Models" (S4D: a diagonal A, zero-order hold, the
S4D-Lin and S4D-Real initialisations, B folded into C, a learnable log Δ); Gu, Dao,
Ermon, Rudra and Ré 2020, "HiPPO: Recurrent Memory with Optimal Polynomial
Projections" (the LegS matrices and the online projection onto Legendre polynomials);
Gu, Goel and Ré 2022 (S4, which uses HiPPO-LegS as the A of a time-invariant SSM).

Shapes follow :mod:`attnlab.ssm`: ``u`` is (b, d, L), batch, channels, length; every
channel has its own SSM with ``n`` states. For the complex S4D-Lin layer the ``n``
states are n/2 complex modes whose conjugates are implied, so the kernel is
:math:`2\,\mathrm{Re}(\cdot)` and the state still holds n real numbers per channel.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from . import _checks
from .ssm import discretize, lti_convolution, lti_recurrence, s4d_real_init

INITS = ("lin", "real")
MODES = ("convolution", "recurrence")


def s4d_lin_init(d: int, n: int, *, dtype=torch.complex64) -> torch.Tensor:
    r"""S4D-Lin: n/2 complex modes :math:`A_k = -\tfrac12 + i\pi k`, k = 0 … n/2 − 1.

    Every mode decays at the same rate 1/2 and oscillates at its own frequency πk, so
    the kernel starts as a damped Fourier series. Each mode stands for a conjugate
    pair, so n must be even. Returns A (d, n/2), the same in every channel.
    """
    _checks.ints("s4d_lin_init", d=d, n=n)
    if n % 2:
        raise ValueError(f"s4d_lin_init: n must be even (n/2 conjugate pairs), got {n}")
    k = torch.arange(n // 2, dtype=torch.float64)
    A = torch.complex(torch.full_like(k, -0.5), math.pi * k)
    return A.to(dtype).repeat(d, 1)


class S4D(nn.Module):
    r"""One S4D layer: d independent diagonal SSMs, discretised by zero-order hold.

    .. math::
        \bar A = e^{\Delta A}, \quad
        \bar B = (\Delta A)^{-1}(e^{\Delta A} - 1)\,\Delta B, \quad
        K_k = \sum_i C_i \bar A_i^{\,k} \bar B_i, \quad y = K * u + D u

    per channel, with B = 1 (S4D folds B into C),
    :math:`A = -e^{\log A_\text{re}} + i A_\text{im}` (the real part stays negative
    whatever the optimiser does) and :math:`\Delta = e^{\log\Delta}`, log Δ drawn
    uniformly in [log dt_min, log dt_max].

    * ``init="lin"``: n/2 complex modes (:func:`s4d_lin_init`); the kernel is
      :math:`2\,\mathrm{Re}\,K`.
    * ``init="real"``: n real modes :math:`A_i = -(i + 1)`
      (:func:`attnlab.ssm.s4d_real_init`); no A_im.

    C starts normal (variance 1 per mode), D standard normal.
    ``forward(u, mode)``: u (b, d, L) → y (b, d, L). ``"convolution"`` builds the kernel
    and convolves with the FFT (how it trains); ``"recurrence"`` steps the state token
    by token (how it generates). Both give the same output; ``step`` runs one token.
    ``forward(u, return_state=True)`` also returns the state after the last token
    (:meth:`state_after`, in closed form), from which ``step`` continues: a prompt runs
    in parallel, the tokens after it one at a time.
    """

    def __init__(self, d: int, n: int = 64, *, init: str = "lin", dt_min: float = 1e-3,
                 dt_max: float = 1e-1, generator: torch.Generator | None = None):
        super().__init__()
        _checks.ints("S4D", d=d, n=n)
        if init not in INITS:
            raise ValueError(f"S4D: init must be one of {INITS}, got {init!r}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"S4D: needs 0 < dt_min <= dt_max, "
                             f"got dt_min={dt_min}, dt_max={dt_max}")
        self.d, self.n, self.init = d, n, init
        lo, hi = math.log(dt_min), math.log(dt_max)
        self.log_dt = nn.Parameter(lo + (hi - lo) * torch.rand(d, generator=generator))
        if init == "lin":
            A = s4d_lin_init(d, n)
            self.log_A_re = nn.Parameter((-A.real).log())
            self.A_im = nn.Parameter(A.imag.clone())
            C = torch.randn(d, n // 2, 2, generator=generator) * math.sqrt(0.5)
        else:
            self.log_A_re = nn.Parameter((-s4d_real_init(d, n)).log())
            C = torch.randn(d, n, generator=generator)
        self.C = nn.Parameter(C)           # a complex C is stored as (real, imag) pairs
        self.D = nn.Parameter(torch.randn(d, generator=generator))

    @property
    def A(self) -> torch.Tensor:
        """The continuous diagonal of A, (d, modes): complex ("lin") or real."""
        real = -self.log_A_re.exp()
        return torch.complex(real, self.A_im) if self.init == "lin" else real

    def discrete(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Ā, B̄ (ZOH, B = 1) and C, each (d, modes); for "lin" C carries the 2."""
        A = self.A
        delta = self.log_dt.exp().unsqueeze(-1)
        A_bar, B_bar = discretize(A, torch.ones_like(A), delta)
        if self.init == "lin":
            return A_bar, B_bar, 2 * torch.view_as_complex(self.C)
        return A_bar, B_bar, self.C

    def kernel(self, length: int) -> torch.Tensor:
        r"""K (d, L): :math:`K_k = \sum_i C_i \bar B_i e^{k\Delta A_i}` (for "lin": Re).

        :math:`\bar A^k` is computed as :math:`e^{k \Delta A}`, a Vandermonde product.
        """
        _checks.ints("S4D.kernel", length=length, minimum=0)
        dtA = self.log_dt.exp().unsqueeze(-1) * self.A                  # (d, modes)
        _, B_bar, C = self.discrete()
        k = torch.arange(length, device=dtA.device, dtype=dtA.real.dtype)
        powers = (dtA.unsqueeze(-1) * k).exp()                           # (d, modes, L)
        K = ((C * B_bar).unsqueeze(-1) * powers).sum(-2)
        return K.real if K.is_complex() else K

    def _check(self, u, mode):
        if mode not in MODES:
            raise ValueError(f"S4D: mode must be one of {MODES}, got {mode!r}")
        _checks.floats("S4D", u=u)
        if u.dim() != 3 or u.shape[1] != self.d:
            raise ValueError(f"S4D: u must be (b, d, L) with d = {self.d}, "
                             f"got shape {tuple(u.shape)}")

    def forward(self, u: torch.Tensor, mode: str = "convolution", *,
                return_state: bool = False):
        """y (b, d, L); with ``return_state`` the pair (y, state after the last token)."""
        self._check(u, mode)
        if mode == "convolution":
            y = lti_convolution(u, self.kernel(u.shape[-1]), self.D)
        else:
            A_bar, B_bar, C = self.discrete()
            y = lti_recurrence(u, A_bar, B_bar, C)
            y = (y.real if y.is_complex() else y) + self.D.unsqueeze(-1) * u
        return (y, self.state_after(u)) if return_state else y

    def state_after(self, u: torch.Tensor) -> torch.Tensor:
        r"""The state after the last token of u, in closed form, without a loop:

        .. math::
            h_{L-1} = \sum_{s=0}^{L-1} \bar A^{\,L-1-s}\, \bar B\, u_s, \qquad
            \bar A^{\,k} = e^{k \Delta A}

        (a reversed Vandermonde product, the kernel's trick). u (b, d, L); returns
        (b, d, modes), the ``state`` that :meth:`step` continues from.
        """
        self._check(u, "convolution")
        dtA = self.log_dt.exp().unsqueeze(-1) * self.A                    # (d, modes)
        _, B_bar, _ = self.discrete()
        lags = torch.arange(u.shape[-1] - 1, -1, -1, device=u.device,
                            dtype=dtA.real.dtype)                          # L − 1 − s
        powers = (dtA.unsqueeze(-1) * lags).exp()                         # (d, modes, L)
        return B_bar * torch.einsum("bdl,dml->bdm", u.to(powers.dtype), powers)

    def state_size(self) -> int:
        """Numbers of state per sequence at inference: n real numbers per channel, d·n
        (S4D-Lin: n/2 complex modes), whatever the context length."""
        return self.d * self.n

    def step(self, u_t: torch.Tensor,
             state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        r"""One token: :math:`h_t = \bar A h_{t-1} + \bar B u_t`,
        :math:`y_t = \mathrm{Re}(C h_t) + D u_t`.

        u_t (b, d); state (b, d, modes) or None (zeros). Returns y_t (b, d), new state.
        """
        _checks.floats("S4D.step", u_t=u_t)
        if u_t.dim() != 2 or u_t.shape[1] != self.d:
            raise ValueError(f"S4D.step: u_t must be (b, d) with d = {self.d}, "
                             f"got shape {tuple(u_t.shape)}")
        A_bar, B_bar, C = self.discrete()
        shape = (u_t.shape[0], *A_bar.shape)
        if state is None:
            state = torch.zeros(shape, dtype=A_bar.dtype, device=u_t.device)
        elif state.shape != shape:
            raise ValueError(f"S4D.step: state must be (b, d, modes) = {shape}, "
                             f"got {tuple(state.shape)}")
        state = A_bar * state + B_bar * u_t.unsqueeze(-1)
        y = (C * state).sum(-1)
        return (y.real if y.is_complex() else y) + self.D * u_t, state


# ------------------------------------------------------------------------------------
# HiPPO-LegS: what S4's A was built to remember
# ------------------------------------------------------------------------------------

def hippo_legs(n: int, *, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The HiPPO-LegS matrices, in the convention :math:`c'(t) = \tfrac1t (A c + B f)`.

    .. math::
        A_{jk} = -\begin{cases}\sqrt{2j+1}\sqrt{2k+1} & j > k\\
                               j + 1 & j = k\\ 0 & j < k\end{cases},
        \qquad B_j = \sqrt{2j+1}

    Returns A (n, n), lower triangular, and B (n,).
    """
    _checks.ints("hippo_legs", n=n)
    j = torch.arange(n, dtype=dtype)
    r = (2 * j + 1).sqrt()
    return -(torch.outer(r, r).tril(-1) + torch.diag(j + 1)), r


def legs_memory(f: torch.Tensor, n: int) -> torch.Tensor:
    r"""Run the HiPPO-LegS memory over a sampled signal: the state after every sample.

    Sample :math:`f_k` is held over (k − 1, k]. In log time τ = ln t the LegS equation
    :math:`c' = \tfrac1t(Ac + Bf)` becomes time-invariant, :math:`dc/dτ = Ac + Bf`, so
    zero-order hold over the step from τ = ln(k − 1) to ln k is exact:

    .. math::
        c_k = E_k\,c_{k-1} + (I - E_k)\,e_0 f_k, \qquad
        E_k = \exp\!\big(A \ln\tfrac{k}{k-1}\big), \qquad c_1 = e_0 f_1,

    using :math:`-A^{-1}B = e_0` (a constant signal is remembered as :math:`e_0`).
    :math:`c_k` is then exactly the coefficient vector of the projection of the held
    signal on [0, k] onto the first n scaled Legendre polynomials
    (:func:`legendre_reconstruct` turns it back into a signal). Float64; one n × n
    matrix exponential per sample. Args: f (L,); n the state size. Returns c (L, n).
    """
    _checks.floats("legs_memory", f=f)
    _checks.ints("legs_memory", n=n)
    if f.dim() != 1:
        raise ValueError(f"legs_memory: f must be a 1-D signal (L,), "
                         f"got shape {tuple(f.shape)}")
    A, _ = hippo_legs(n)
    if f.shape[0] == 0:
        return torch.zeros(0, n, dtype=A.dtype)
    e0 = torch.zeros(n, dtype=A.dtype)
    e0[0] = 1
    k = torch.arange(2, f.shape[0] + 1, dtype=A.dtype)
    steps = torch.log(k / (k - 1)).view(-1, 1, 1)                   # Δτ of each step
    E = torch.linalg.matrix_exp(A * steps)                               # (L - 1, n, n)
    states, c = [], torch.zeros(n, dtype=A.dtype)
    for i, f_k in enumerate(f.double().tolist()):
        c = e0 * f_k if i == 0 else E[i - 1] @ (c - e0 * f_k) + e0 * f_k
        states.append(c)
    return torch.stack(states)


def legendre_reconstruct(c: torch.Tensor, length: int) -> torch.Tensor:
    r"""The history that LegS coefficients describe, on ``length`` midpoints of [0, t]:

    .. math::
        \hat f(s) = \sum_{j=0}^{n-1} c_j \sqrt{2j+1}\,
                    P_j\!\left(\tfrac{2s}{t} - 1\right),
        \qquad s = (i + \tfrac12)\,\tfrac{t}{\text{length}}

    Args: c (..., n); length ≥ 0. Returns (..., length).
    """
    _checks.floats("legendre_reconstruct", c=c)
    _checks.ints("legendre_reconstruct", length=length, minimum=0)
    if c.dim() == 0 or c.shape[-1] == 0:
        raise ValueError(f"legendre_reconstruct: c must be (..., n) with n >= 1, "
                         f"got shape {tuple(c.shape)}")
    n = c.shape[-1]
    x = (2 * torch.arange(length, dtype=c.dtype) + 1) / length - 1   # in [-1, 1]
    P = [torch.ones_like(x), x]
    for j in range(1, n - 1):                                   # Bonnet's recurrence
        P.append(((2 * j + 1) * x * P[j] - j * P[j - 1]) / (j + 1))
    scale = (2 * torch.arange(n, dtype=c.dtype) + 1).sqrt().unsqueeze(-1)
    return c @ (torch.stack(P[:n]) * scale)
