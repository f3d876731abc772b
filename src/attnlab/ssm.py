"""State space models: from a continuous linear system to Mamba's selective scan.

Read alongside: Gu, Goel and Ré 2022, "Efficiently Modeling Long Sequences with Structured
State Spaces" (S4: discretisation, the recurrent and convolutional views); Gu, Gupta, Goel and
Ré 2022, "On the Parameterization and Initialization of Diagonal State Space Models" (S4D,
the S4D-real initialisation); Gu and Dao 2023, "Mamba: Linear-Time Sequence Modeling with
Selective State Spaces" (selection, the selective scan, the Mamba block, Algorithm 2 and
§3.6); Dao and Gu 2024, "Transformers are SSMs" (Mamba-2/SSD: chunked computation);
Blelloch 1990, "Prefix Sums and Their Applications" (the blocked scan).

Shape letters, as in the Mamba authors' reference ``selective_scan_ref``:

    b   batch
    d   channels (d_inner in the Mamba block: every channel has its own SSM)
    L   sequence length
    n   state size per channel (d_state; N in the papers)
    d_model  width of the residual stream around a Mamba block

The continuous system is :math:`h'(t) = A h(t) + B u(t)`, :math:`y(t) = C h(t) + D u(t)`, with
a diagonal A (one decay per state), so every function here treats A as the vector of its
diagonal. A time-invariant (LTI) system has one convolution kernel and can be computed with an
FFT; a selective system (Δ, B, C depend on the token) has none and is computed with a scan.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from . import _checks
from .blocks import RMSNorm

DISCRETISATIONS = ("zoh", "euler", "bilinear")
SCAN_METHODS = ("sequential", "chunked", "indexed", "logspace")


# ---------------------------------------------------------------------------------------------
# Chapter 10: a linear time-invariant SSM, discretised; recurrence = convolution
# ---------------------------------------------------------------------------------------------

def discretize(A: torch.Tensor, B: torch.Tensor, delta, method: str = "zoh") -> tuple[torch.Tensor, torch.Tensor]:
    r"""Turn a continuous diagonal SSM (A, B) into a discrete one (Ā, B̄) for step size Δ.

    .. math::
        \text{zoh:}\quad \bar A = e^{\Delta A},\quad \bar B = (\Delta A)^{-1}(e^{\Delta A} - 1)\,\Delta B
        \qquad
        \text{euler:}\quad \bar A = 1 + \Delta A,\quad \bar B = \Delta B
        \qquad
        \text{bilinear:}\quad \bar A = \frac{1 + \Delta A/2}{1 - \Delta A/2},\quad \bar B = \frac{\Delta B}{1 - \Delta A/2}

    Zero-order hold (ZOH) is exact when the input is constant over each step; Euler is
    first order and unstable once :math:`\Delta |A| > 2`; bilinear (S4's choice) is second
    order and stable for every Δ > 0 when A < 0. Mamba uses ZOH for Ā and Euler's ΔB for B̄.

    Args: A (..., n) the diagonal of A (negative for a stable system); B broadcastable to A;
    delta a positive number or a tensor broadcastable to A. Returns Ā, B̄ of the broadcast shape.
    """
    if method not in DISCRETISATIONS:
        raise ValueError(f"method must be one of {DISCRETISATIONS}, got {method!r}")
    if not isinstance(A, torch.Tensor) or not isinstance(B, torch.Tensor):
        raise TypeError(f"A and B must be tensors, got {type(A).__name__} and {type(B).__name__}")
    delta = torch.as_tensor(delta, dtype=A.dtype, device=A.device)
    if (delta <= 0).any():
        raise ValueError("delta must be positive")
    dA = delta * A
    if method == "zoh":
        # (e^x - 1)/x, with its limit 1 at x = 0; expm1 keeps it accurate for small |x|
        phi = torch.where(dA == 0, torch.ones_like(dA), torch.expm1(dA) / torch.where(dA == 0, torch.ones_like(dA), dA))
        return dA.exp(), phi * delta * B
    if method == "euler":
        return 1 + dA, delta * B
    return (1 + dA / 2) / (1 - dA / 2), delta * B / (1 - dA / 2)


def ssm_kernel(A_bar: torch.Tensor, B_bar: torch.Tensor, C: torch.Tensor, length: int) -> torch.Tensor:
    r"""The convolution kernel of a discrete diagonal LTI SSM (its impulse response).

    .. math:: K_k = \sum_{i=1}^{n} C_i \,\bar A_i^{\,k}\, \bar B_i, \qquad k = 0, \dots, L-1

    Args: A_bar, B_bar, C (..., n). Returns K (..., L).
    """
    _checks.ints("ssm_kernel", length=length, minimum=0)
    powers = A_bar.unsqueeze(-1) ** torch.arange(length, dtype=A_bar.dtype, device=A_bar.device)  # (..., n, L)
    return ((C * B_bar).unsqueeze(-1) * powers).sum(-2)


def _check_lti(u, A_bar, B_bar, C):
    if not isinstance(u, torch.Tensor) or u.dim() != 3:
        raise ValueError(f"u must be a (b, d, L) tensor, got {getattr(u, 'shape', type(u).__name__)}")
    d = u.shape[1]
    for name, t in (("A_bar", A_bar), ("B_bar", B_bar), ("C", C)):
        if t.dim() != 2 or t.shape[0] != d:
            raise ValueError(f"{name} must be (d, n) = ({d}, n), got {tuple(t.shape)}")


def lti_recurrence(u: torch.Tensor, A_bar: torch.Tensor, B_bar: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor | None = None) -> torch.Tensor:
    r"""Run a discrete diagonal LTI SSM as a recurrence, one step per token.

    .. math:: h_t = \bar A \odot h_{t-1} + \bar B\, u_t, \qquad y_t = C \cdot h_t + D u_t, \qquad h_{-1} = 0

    Args: u (b, d, L); A_bar, B_bar, C (d, n), one SSM per channel; D (d,) or None. Returns y (b, d, L).
    """
    _check_lti(u, A_bar, B_bar, C)
    h = u.new_zeros(u.shape[0], *A_bar.shape)
    ys = []
    for u_t in u.unbind(-1):
        h = A_bar * h + B_bar * u_t.unsqueeze(-1)
        ys.append((h * C).sum(-1))
    y = torch.stack(ys, dim=-1)
    return y if D is None else y + D.unsqueeze(-1) * u


def lti_convolution(u: torch.Tensor, K: torch.Tensor, D: torch.Tensor | None = None) -> torch.Tensor:
    r"""The same system as a causal convolution, computed with the FFT in O(L log L).

    .. math:: y_t = \sum_{k=0}^{t} K_k\, u_{t-k} + D u_t

    Both signals are zero-padded to 2L so the FFT's circular convolution does not wrap around.

    Args: u (b, d, L); K (d, L) from :func:`ssm_kernel`; D (d,) or None. Returns y (b, d, L).
    """
    if u.dim() != 3 or K.shape != u.shape[1:]:
        raise ValueError(f"u must be (b, d, L) and K (d, L); got u {tuple(u.shape)}, K {tuple(K.shape)}")
    length = u.shape[-1]
    y = torch.fft.irfft(torch.fft.rfft(u, n=2 * length) * torch.fft.rfft(K, n=2 * length), n=2 * length)[..., :length]
    return y if D is None else y + D.unsqueeze(-1) * u


def s4d_real_init(d: int, n: int, *, dtype=torch.float32) -> torch.Tensor:
    r"""S4D-real initialisation of the diagonal of A: :math:`A_{i} = -(i + 1)` for i = 0 … n-1, in every channel.

    Mamba stores :math:`A_\text{log} = \log(-A)` and uses :math:`A = -\exp(A_\text{log})`, which stays
    negative (stable) whatever the optimiser does. Returns A (d, n).
    """
    _checks.ints("s4d_real_init", d=d, n=n)
    return -torch.arange(1, n + 1, dtype=dtype).repeat(d, 1)


def state_size(d: int, n: int, d_conv: int = 1) -> int:
    r"""Numbers a Mamba-style layer keeps between tokens at inference: :math:`d\,(n + d_\text{conv} - 1)`.

    Each of the d channels holds an n-dimensional SSM state and the last d_conv − 1 inputs of
    its causal convolution (d_conv = 1: no convolution). It does not depend on the context length.
    """
    if min(d, n, d_conv) < 1:
        raise ValueError(f"d, n and d_conv must be positive, got {d}, {n}, {d_conv}")
    return d * (n + d_conv - 1)


# ---------------------------------------------------------------------------------------------
# Chapter 11: the selective scan
# ---------------------------------------------------------------------------------------------

def _scan_sequential(log_a: torch.Tensor, x: torch.Tensor, chunk: int | None) -> torch.Tensor:
    """h_t = a_t h_{t-1} + x_t, one step per time step; unbind gives L views whose backward is one stack."""
    h, hs = torch.zeros_like(x[:, :, 0]), []
    for a_t, x_t in zip(log_a.exp().unbind(2), x.unbind(2)):
        h = a_t * h + x_t
        hs.append(h)
    return torch.stack(hs, dim=2)


def _scan_indexed(log_a: torch.Tensor, x: torch.Tensor, chunk: int | None) -> torch.Tensor:
    """The pitfall: ``a[:, :, t]`` in a loop. Each index's backward builds a full-size gradient: O(L²)."""
    a, h, hs = log_a.exp(), torch.zeros_like(x[:, :, 0]), []
    for t in range(x.shape[2]):
        h = a[:, :, t] * h + x[:, :, t]
        hs.append(h)
    return torch.stack(hs, dim=2)


def _chunk_size(length: int, chunk: int | None) -> int:
    if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"chunk must be a positive int or None, got {chunk!r}")
    return chunk or max(1, math.isqrt(length - 1) + 1)   # ⌈√L⌉ balances the two passes


def _scan_logspace(log_a: torch.Tensor, x: torch.Tensor, chunk: int | None) -> torch.Tensor:
    r"""The shortcut: within a chunk :math:`h_t = e^{\Lambda_t}\sum_{s\le t} e^{-\Lambda_s} x_s`, two cumsums, no loop.

    :math:`e^{-\Lambda_s}` grows like the inverse of the decay accumulated since the chunk began,
    and overflows float32 (inf, then NaN) once that exceeds about 88 nats.
    """
    b, d, length, n = x.shape
    chunk = _chunk_size(length, chunk)
    pad = -length % chunk
    shape = (b, d, (length + pad) // chunk, chunk, n)
    log_a, x = (F.pad(t, (0, 0, 0, pad)).reshape(shape) for t in (log_a, x))
    cum = log_a.cumsum(3)
    decay = cum.exp()
    local = decay * (x * (-cum).exp()).cumsum(3)                                  # scan of each chunk from 0
    carry, entering = torch.zeros_like(x[:, :, 0, 0]), []
    for decay_c, last_c in zip(decay[:, :, :, -1].unbind(2), local[:, :, :, -1].unbind(2)):
        entering.append(carry)
        carry = decay_c * carry + last_c
    h = local + decay * torch.stack(entering, dim=2).unsqueeze(3)
    return h.flatten(2, 3)[:, :, :length]


@torch.no_grad()
def _blocked_scan(a: torch.Tensor, x: torch.Tensor, chunk: int, reverse: bool = False) -> torch.Tensor:
    r"""The blocked scan of :math:`h_t = a_t h_{t-1} + x_t` (:math:`h_{t+1}` if ``reverse``), in place of autograd.

    a, x: (L, b, d, n), time first, L a multiple of ``chunk``. Pass 1 scans every chunk at once
    from a zero state (``chunk`` steps, each over all L/chunk chunks), keeping the running
    product P of the decays; pass 2 carries the state entering each chunk (L/chunk steps);
    then :math:`h = h^\text{local} + P\,h^\text{in}`. Only products of decays appear, never their
    inverses, so nothing can overflow.
    """
    a, x = (t.view(-1, chunk, *t.shape[1:]) for t in (a, x))                     # (c, T, b, d, n)
    local, decay = torch.empty_like(x), torch.empty_like(x)
    h, p = torch.zeros_like(x[:, 0]), torch.ones_like(x[:, 0])
    steps = range(chunk - 1, -1, -1) if reverse else range(chunk)
    for t in steps:
        h = torch.addcmul(x[:, t], a[:, t], h, out=local[:, t])
        p = torch.mul(a[:, t], p, out=decay[:, t])
    edge = 0 if reverse else -1                                                  # where a chunk hands over
    carry, entering = torch.zeros_like(x[0, 0]), torch.empty_like(h)
    for k in (range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])):
        entering[k] = carry
        carry = torch.addcmul(local[k, edge], decay[k, edge], carry)
    return local.addcmul_(decay, entering.unsqueeze(1)).flatten(0, 1)


class _ChunkedSelectiveScan(torch.autograd.Function):
    r"""The selective scan by the blocked scan, with a hand-written backward that is the same scan run backwards:

    .. math:: g_t = C_t\,\dot y_t + a_{t+1} g_{t+1}, \quad
              \frac{\partial\ell}{\partial x_t} = g_t, \quad
              \frac{\partial\ell}{\partial \log a_t} = g_t \odot a_t h_{t-1}

    where :math:`\dot y_t = \partial\ell/\partial y_t`, :math:`a_t = e^{\Delta_t A}`, :math:`x_t = \Delta_t u_t B_t`.
    The big (L, b, d, n) tensors are built time-first so each scan step reads contiguous memory.
    """

    @staticmethod
    def forward(ctx, u, delta, A, B, C, chunk):
        length = u.shape[-1]
        pad = -length % chunk
        delta_t, du_t = (F.pad(t, (0, pad)).permute(2, 0, 1).contiguous() for t in (delta, delta * u))   # (L', b, d)
        B_t, C_t = (F.pad(t, (0, pad)).permute(2, 0, 1).contiguous().unsqueeze(2) for t in (B, C))         # (L', b, 1, n)
        a = (delta_t.unsqueeze(-1) * A).exp_()                                                  # (L', b, d, n)
        h = _blocked_scan(a, du_t.unsqueeze(-1) * B_t, chunk)
        y = (h * C_t).sum(-1)[:length].permute(1, 2, 0)                                         # (b, d, L)
        ctx.save_for_backward(u, delta, A, B, C, a, h)
        ctx.chunk, ctx.length = chunk, length
        return y, h[length - 1]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y, grad_last):
        u, delta, A, B, C, a, h = ctx.saved_tensors
        length, pad = ctx.length, a.shape[0] - ctx.length
        gy_t = F.pad(grad_y, (0, pad)).permute(2, 0, 1).contiguous().unsqueeze(-1)                           # (L', b, d, 1)
        B_t, C_t = (F.pad(t, (0, pad)).permute(2, 0, 1).contiguous().unsqueeze(2) for t in (B, C))
        delta_t, du_t = (F.pad(t, (0, pad)).permute(2, 0, 1).contiguous() for t in (delta, delta * u))
        grad_h = gy_t * C_t
        grad_h[length - 1] += grad_last
        a_next = torch.cat([a[1:], torch.ones_like(a[:1])])
        g = _blocked_scan(a_next, grad_h, ctx.chunk, reverse=True)                              # ∂ℓ/∂x_t
        grad_C = gy_t.transpose(-1, -2) @ h                                                     # (L', b, 1, n)
        grad_B = du_t.unsqueeze(-2) @ g
        grad_du = (g @ B_t.transpose(-1, -2)).squeeze(-1)                                        # (L', b, d)
        h_prev = torch.cat([torch.zeros_like(h[:1]), h[:-1]])
        grad_log_a = g.mul_(a).mul_(h_prev)                                                      # g no longer needed
        grad_delta = (grad_log_a * A).sum(-1)
        grad_A = (grad_log_a * delta_t.unsqueeze(-1)).sum((0, 1))                                # pairwise sum: accurate
        back = lambda t: t[:length].permute(1, 2, 0)                                              # (L', b, ·) -> (b, ·, L)
        grad_du = back(grad_du)
        return (grad_du * delta, back(grad_delta) + grad_du * u, grad_A, back(grad_B.squeeze(2)), back(grad_C.squeeze(2)), None)


_SCANS = {"sequential": _scan_sequential, "indexed": _scan_indexed, "logspace": _scan_logspace}


def _check_scan(u, delta, A, B, C, D, z, delta_bias, method):
    if method not in SCAN_METHODS:
        raise ValueError(f"method must be one of {SCAN_METHODS}, got {method!r}")
    tensors = {"u": u, "delta": delta, "A": A, "B": B, "C": C, "D": D, "z": z, "delta_bias": delta_bias}
    _checks.floats("selective_scan", **tensors)
    if u.dim() != 3 or u.shape[-1] == 0:
        raise ValueError(f"u must be (b, d, L) with L >= 1, got shape {tuple(u.shape)}")
    b, d, length = u.shape
    if A.dim() != 2 or A.shape[0] != d:
        raise ValueError(f"A must be (d, n) = ({d}, n), got shape {tuple(A.shape)}")
    n = A.shape[1]
    needed = {"delta": (b, d, length), "B": (b, n, length), "C": (b, n, length), "z": (b, d, length),
              "D": (d,), "delta_bias": (d,)}
    for name, t in (("delta", delta), ("B", B), ("C", C), ("z", z), ("D", D), ("delta_bias", delta_bias)):
        if t is not None and tuple(t.shape) != needed[name]:
            raise ValueError(f"{name} must have shape {needed[name]} (b, d, L, n = {b}, {d}, {length}, {n}), "
                             f"got {tuple(t.shape)}")
    if (A > 0).any():
        raise ValueError(f"selective_scan: A must be <= 0 (a stable system, as Mamba's A = -exp(A_log) is); "
                         f"got max A = {A.max().item():.3g}, which makes the state grow without bound")


def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor | None = None, z: torch.Tensor | None = None, *,
                   delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                   method: str = "sequential", chunk: int | None = None, return_last_state: bool = False):
    r"""Mamba's selective scan (Gu and Dao 2023, Algorithm 2), with the reference's argument order and shapes.

    .. math::
        \Delta_t = \mathrm{softplus}(\delta_t + b_\Delta), \quad
        h_t = e^{\Delta_t A} \odot h_{t-1} + \Delta_t B_t\, u_t, \quad
        y_t = C_t^\top h_t + D u_t, \quad
        \text{out}_t = y_t \odot \mathrm{SiLU}(z_t)

    per channel, with :math:`h_{-1} = 0` (bias and softplus only when asked for). Δ, B and C
    change with t: the system is not time-invariant, has no convolution kernel, and is computed
    by a scan over the linear recurrence :math:`h_t = a_t h_{t-1} + x_t`:

    * ``"sequential"``: one step per token over ``unbind``-ed slices; autograd does the backward
      (the reference);
    * ``"chunked"``: the blocked scan: every chunk of ``chunk`` steps (default ⌈√L⌉) is scanned
      at once from a zero state, then the states entering the chunks are carried across, so
      T + L/T Python steps replace L; exact, only products of decays, and its backward is the
      same scan run backwards in time (written by hand, first derivatives only);
    * ``"indexed"``: the sequential loop written with ``a[:, :, t]``: same values, but its
      backward pass costs O(L²) (a lesson, not a method to use);
    * ``"logspace"``: within chunks, :math:`h_t = e^{\Lambda_t} \sum_{s \le t} e^{-\Lambda_s} x_s`
      with :math:`\Lambda_t = \sum_{s\le t}\Delta_s A`; vectorised, but :math:`e^{-\Lambda_s}`
      overflows on strongly decaying input (a lesson, not a method to use).

    Args:
        u, delta, z: (b, d, L). A: (d, n), real, <= 0 (a stable system; Mamba's A = -exp(A_log)).
        B, C: (b, n, L), shared by the d channels. D, delta_bias: (d,).
        return_last_state: also return :math:`h_{L-1}`, (b, d, n).
    Returns: out (b, d, L), and the last state if asked for.
    Raises: TypeError for non-tensors or integer tensors; ValueError, naming the
    argument, for a wrong shape, an A with a positive entry or a negative step Δ (the state
    would grow without bound and overflow to inf and NaN, in every method).
    """
    _check_scan(u, delta, A, B, C, D, z, delta_bias, method)
    chunk = _chunk_size(u.shape[-1], chunk)
    if delta_bias is not None:
        delta = delta + delta_bias.unsqueeze(-1)
    if delta_softplus:
        delta = F.softplus(delta)
    if (delta < 0).any():
        raise ValueError(f"selective_scan: delta must be >= 0 (a step size, after delta_bias and any softplus), "
                         f"got min {delta.min().item():.3g}; pass delta_softplus=True for raw values")
    if method == "chunked":
        y, last = _ChunkedSelectiveScan.apply(u, delta, A, B, C, chunk)
    else:
        log_a = delta.unsqueeze(-1) * A.unsqueeze(1)                               # (b, d, L, n): Δ_t A ≤ 0
        x = (delta * u).unsqueeze(-1) * B.transpose(1, 2).unsqueeze(1)             # (b, d, L, n): Δ_t B_t u_t
        h = _SCANS[method](log_a, x, chunk)
        y, last = (h * C.transpose(1, 2).unsqueeze(1)).sum(-1), h[:, :, -1]        # y_t = C_t · h_t
    if D is not None:
        y = y + D.unsqueeze(-1) * u
    if z is not None:
        y = y * F.silu(z)
    return (y, last) if return_last_state else y


def recurrence_rounding(a: float, x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    r"""How far :math:`h_t = a h_{t-1} + x_t`, run in ``dtype``, drifts from the exact recurrence.

    Every step rounds: :math:`\hat h_t = a \hat h_{t-1} + x_t + \delta_t`, so the error
    :math:`e_t = \hat h_t - h_t` obeys :math:`e_t = a e_{t-1} + \delta_t` and
    :math:`|e_N| \le \sum_k a^k |\delta_{N-k}| \le \max_t|\delta_t| / (1 - a)` for 0 ≤ a < 1:
    bounded, whatever N. (a and x should be exactly representable in ``dtype``, so that the
    only errors are the steps' roundings.)

    Args: a, a decay in [0, 1); x (L,) inputs. Returns |e_t| (L,) in float64, and the bound
    :math:`\max_t|\delta_t|/(1-a)` with the local roundings δ_t measured along the run.
    """
    if not 0 <= a < 1:
        raise ValueError(f"a must lie in [0, 1), got {a}")
    h_low, h_exact = torch.zeros((), dtype=dtype), torch.zeros((), dtype=torch.float64)
    a_low, errors, local = torch.tensor(a, dtype=dtype), [], []
    for x_t in x.to(dtype).unbind(0):
        step = a * h_low.double() + x_t.double()            # what this step should give, from the rounded state
        h_low = a_low * h_low + x_t
        h_exact = a * h_exact + x_t.double()
        local.append((h_low.double() - step).abs())
        errors.append((h_low.double() - h_exact).abs())
    return torch.stack(errors), torch.stack(local).max().item() / (1 - a)


# ---------------------------------------------------------------------------------------------
# The Mamba block
# ---------------------------------------------------------------------------------------------

@dataclass
class MambaConfig:
    """Sizes of a Mamba block; defaults are the paper's (expand 2, d_state 16, d_conv 4, dt in [1e-3, 0.1])."""

    d_model: int
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    dt_rank: int | None = None      # default ⌈d_model / 16⌉
    dt_min: float = 1e-3
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    method: str = "chunked"         # how forward() runs the selective scan

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def rank(self) -> int:
        return self.dt_rank or math.ceil(self.d_model / 16)


class Mamba(nn.Module):
    r"""The Mamba mixer (Gu and Dao 2023, Figure 3 and §3.6): (b, L, d_model) → (b, L, d_model).

    .. math::
        [x; z] = W_\text{in} u, \quad x \leftarrow \mathrm{SiLU}(\mathrm{conv1d}(x)), \quad
        [\delta; B; C] = W_x x, \quad \Delta = \mathrm{softplus}(W_\Delta \delta + b_\Delta),

    then :func:`selective_scan` with :math:`A = -\exp(A_\text{log})` and the gate SiLU(z), and
    :math:`W_\text{out}`. :meth:`step` computes the same thing one token at a time from a state of
    :func:`state_size` numbers per sequence, whatever the context length.
    """

    def __init__(self, config: MambaConfig):
        super().__init__()
        self.config = c = config
        self.in_proj = nn.Linear(c.d_model, 2 * c.d_inner, bias=False)
        self.conv1d = nn.Conv1d(c.d_inner, c.d_inner, c.d_conv, groups=c.d_inner, padding=c.d_conv - 1)
        self.x_proj = nn.Linear(c.d_inner, c.rank + 2 * c.d_state, bias=False)
        self.dt_proj = nn.Linear(c.rank, c.d_inner, bias=True)
        self.A_log = nn.Parameter(torch.log(-s4d_real_init(c.d_inner, c.d_state)))
        self.A_log._no_weight_decay = True          # decay would pull every A towards −1
        self.D = nn.Parameter(torch.ones(c.d_inner))
        self.out_proj = nn.Linear(c.d_inner, c.d_model, bias=False)
        self._init_dt()

    @torch.no_grad()
    def _init_dt(self):
        r"""Δ starts log-uniform in [dt_min, dt_max]: the bias is softplus⁻¹(Δ) = Δ + log(1 − e^{−Δ}) (§3.6)."""
        c = self.config
        nn.init.uniform_(self.dt_proj.weight, -c.rank ** -0.5, c.rank ** -0.5)
        dt = torch.exp(torch.rand(c.d_inner) * (math.log(c.dt_max) - math.log(c.dt_min)) + math.log(c.dt_min))
        dt = dt.clamp(min=c.dt_init_floor)
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def _ssm_inputs(self, x: torch.Tensor):
        """x (..., d_inner) → δ (..., d_inner) before bias, B and C (..., n)."""
        c = self.config
        dt, B, C = self.x_proj(x).split([c.rank, c.d_state, c.d_state], dim=-1)
        return F.linear(dt, self.dt_proj.weight), B, C

    def forward(self, u: torch.Tensor, *, method: str | None = None) -> torch.Tensor:
        """u (b, L, d_model) → (b, L, d_model); ``method`` overrides the config's scan method."""
        if u.dim() != 3 or u.shape[-1] != self.config.d_model:
            raise ValueError(f"u must be (b, L, d_model={self.config.d_model}), got {tuple(u.shape)}")
        length = u.shape[1]
        x, z = self.in_proj(u).chunk(2, dim=-1)                                     # (b, L, d_inner) each
        x = F.silu(self.conv1d(x.transpose(1, 2))[..., :length])                    # (b, d_inner, L), causal
        dt, B, C = self._ssm_inputs(x.transpose(1, 2))
        y = selective_scan(x, dt.transpose(1, 2), -self.A_log.exp(), B.transpose(1, 2), C.transpose(1, 2),
                           self.D, z.transpose(1, 2), delta_bias=self.dt_proj.bias, delta_softplus=True,
                           method=method or self.config.method)
        return self.out_proj(y.transpose(1, 2))

    def init_state(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero state: the last d_conv − 1 conv inputs (b, d_inner, d_conv − 1) and the SSM state (b, d_inner, n)."""
        c, p = self.config, self.A_log
        return (p.new_zeros(batch, c.d_inner, c.d_conv - 1), p.new_zeros(batch, c.d_inner, c.d_state))

    def step(self, u_t: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        r"""One token: u_t (b, d_model) and a state → (out_t (b, d_model), new state). Constant cost per token.

        .. math:: h_t = e^{\Delta_t A} \odot h_{t-1} + \Delta_t B_t x_t, \qquad y_t = C_t^\top h_t + D x_t
        """
        if u_t.dim() != 2 or u_t.shape[-1] != self.config.d_model:
            raise ValueError(f"u_t must be (b, d_model={self.config.d_model}), got {tuple(u_t.shape)}")
        conv_state, h = state
        x, z = self.in_proj(u_t).chunk(2, dim=-1)                                   # (b, d_inner)
        window = torch.cat([conv_state, x.unsqueeze(-1)], dim=-1)                   # (b, d_inner, d_conv)
        x = F.silu((window * self.conv1d.weight.squeeze(1)).sum(-1) + self.conv1d.bias)
        dt, B, C = self._ssm_inputs(x)
        delta = F.softplus(dt + self.dt_proj.bias)                                  # (b, d_inner)
        A = -self.A_log.exp()
        h = torch.exp(delta.unsqueeze(-1) * A) * h + (delta * x).unsqueeze(-1) * B.unsqueeze(1)
        y = (h * C.unsqueeze(1)).sum(-1) + self.D * x
        return self.out_proj(y * F.silu(z)), (window[..., 1:], h)

    def state_size(self) -> int:
        """Numbers of state per sequence at inference (see :func:`state_size`)."""
        c = self.config
        return state_size(c.d_inner, c.d_state, c.d_conv)


class MambaLM(nn.Module):
    """A small language model of pre-norm residual Mamba blocks: tokens (b, L) → logits (b, L, vocab)."""

    def __init__(self, vocab: int, n_layers: int, config: MambaConfig):
        super().__init__()
        self.embed = nn.Embedding(vocab, config.d_model)
        self.norms = nn.ModuleList(RMSNorm(config.d_model) for _ in range(n_layers))
        self.mixers = nn.ModuleList(Mamba(config) for _ in range(n_layers))
        self.norm_f = RMSNorm(config.d_model)
        self.head = nn.Linear(config.d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int):
            raise ValueError(f"MambaLM: tokens must be integer ids (b, L), got {tuple(tokens.shape)} {tokens.dtype}")
        x = self.embed(tokens)
        for norm, mixer in zip(self.norms, self.mixers):
            x = x + mixer(norm(x))
        return self.head(self.norm_f(x))
