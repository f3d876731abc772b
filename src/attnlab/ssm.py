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

def discretize(A: torch.Tensor, B: torch.Tensor, delta,
               method: str = "zoh") -> tuple[torch.Tensor, torch.Tensor]:
    r"""Turn a continuous diagonal SSM (A, B) into a discrete one (Ā, B̄) for a step Δ.

    .. math::
        \text{zoh:}\quad \bar A = e^{\Delta A},\quad
        \bar B = (\Delta A)^{-1}(e^{\Delta A} - 1)\,\Delta B
        \qquad
        \text{euler:}\quad \bar A = 1 + \Delta A,\quad \bar B = \Delta B
        \qquad
        \text{bilinear:}\quad \bar A = \frac{1 + \Delta A/2}{1 - \Delta A/2},\quad
        \bar B = \frac{\Delta B}{1 - \Delta A/2}

    Zero-order hold (ZOH) is exact when the input is constant over each step; Euler
    is first order and unstable once :math:`\Delta |A| > 2`; bilinear (S4's choice) is
    second order and stable for every Δ > 0 when A < 0. Mamba uses ZOH for Ā and
    Euler's ΔB for B̄.

    Args: A (..., n) the diagonal of A, real or complex (real part negative for a
    stable system, as in S4D's complex modes); B broadcastable to A; delta a positive
    number or a real tensor broadcastable to A. Returns Ā, B̄ of the broadcast shape.
    """
    if method not in DISCRETISATIONS:
        raise ValueError(f"method must be one of {DISCRETISATIONS}, got {method!r}")
    if not isinstance(A, torch.Tensor) or not isinstance(B, torch.Tensor):
        raise TypeError(f"A and B must be tensors, got {type(A).__name__} "
                        f"and {type(B).__name__}")
    # Δ is real, also for a complex A
    delta = torch.as_tensor(delta, dtype=A.real.dtype, device=A.device)
    if (delta <= 0).any():
        raise ValueError("delta must be positive")
    for name, t in (("B", B), ("delta", delta)):
        try:
            torch.broadcast_shapes(A.shape, t.shape)
        except RuntimeError:
            raise ValueError(f"discretize: {name} must broadcast to A's shape "
                             f"{tuple(A.shape)}, got {tuple(t.shape)}") from None
    dA = delta * A
    if method == "zoh":
        # (e^x - 1)/x, with its limit 1 at x = 0; expm1 keeps it accurate for small |x|
        zero, one = dA == 0, torch.ones_like(dA)
        phi = torch.where(zero, one, torch.expm1(dA) / torch.where(zero, one, dA))
        return dA.exp(), phi * delta * B
    if method == "euler":
        return 1 + dA, delta * B
    return (1 + dA / 2) / (1 - dA / 2), delta * B / (1 - dA / 2)


def ssm_kernel(A_bar: torch.Tensor, B_bar: torch.Tensor, C: torch.Tensor,
               length: int) -> torch.Tensor:
    r"""The convolution kernel of a discrete diagonal LTI SSM (its impulse response).

    .. math::
        K_k = \sum_{i=1}^{n} C_i \,\bar A_i^{\,k}\, \bar B_i, \qquad k = 0, \dots, L-1

    Args: A_bar, B_bar, C (..., n), real or complex. Returns K (..., L) (complex for
    complex modes: a layer whose modes come in conjugate pairs uses
    :math:`2\,\mathrm{Re}\,K`).
    """
    _checks.ints("ssm_kernel", length=length, minimum=0)
    _tensors("ssm_kernel", A_bar=A_bar, B_bar=B_bar, C=C)
    for name, t in (("B_bar", B_bar), ("C", C)):
        if t.shape != A_bar.shape or A_bar.dim() == 0:
            raise ValueError(f"ssm_kernel: {name} must have A_bar's shape (..., n) = "
                             f"{tuple(A_bar.shape)}, got {tuple(t.shape)}")
    # real exponents, also for a complex Ā
    k = torch.arange(length, dtype=A_bar.real.dtype, device=A_bar.device)
    powers = A_bar.unsqueeze(-1) ** k                                   # (..., n, L)
    return ((C * B_bar).unsqueeze(-1) * powers).sum(-2)


def _tensors(fn: str, **tensors) -> None:
    """Each argument is a real floating-point or a complex tensor (None: left out)."""
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not (t.is_floating_point() or t.is_complex()):
            raise TypeError(f"{fn}: {name} must be a floating-point or complex tensor, "
                            f"got {t.dtype}")


def _check_u_D(fn: str, u, D) -> None:
    _tensors(fn, u=u, D=D)
    if u.dim() != 3:
        raise ValueError(f"{fn}: u must be a (b, d, L) tensor, got shape {tuple(u.shape)}")
    if D is not None and D.shape != u.shape[1:2]:
        raise ValueError(f"{fn}: D must be (d,) = ({u.shape[1]},), got {tuple(D.shape)}")


def _check_lti(u, A_bar, B_bar, C, D=None):
    _check_u_D("lti_recurrence", u, D)
    _tensors("lti_recurrence", A_bar=A_bar, B_bar=B_bar, C=C)
    d = u.shape[1]
    for name, t in (("A_bar", A_bar), ("B_bar", B_bar), ("C", C)):
        if t.dim() != 2 or t.shape[0] != d or t.shape != A_bar.shape:
            raise ValueError(f"lti_recurrence: {name} must be (d, n) = ({d}, n), the same "
                             f"n for all three, got {tuple(t.shape)}")


def lti_recurrence(u: torch.Tensor, A_bar: torch.Tensor, B_bar: torch.Tensor,
                   C: torch.Tensor, D: torch.Tensor | None = None) -> torch.Tensor:
    r"""Run a discrete diagonal LTI SSM as a recurrence, one step per token.

    .. math::
        h_t = \bar A \odot h_{t-1} + \bar B\, u_t, \qquad y_t = C \cdot h_t + D u_t,
        \qquad h_{-1} = 0

    Args: u (b, d, L); A_bar, B_bar, C (d, n), one SSM per channel; D (d,) or None.
    Returns y (b, d, L).
    """
    _check_lti(u, A_bar, B_bar, C, D)
    h = u.new_zeros(u.shape[0], *A_bar.shape)
    ys = []
    for u_t in u.unbind(-1):
        h = A_bar * h + B_bar * u_t.unsqueeze(-1)
        ys.append((h * C).sum(-1))
    y = torch.stack(ys, dim=-1)
    return y if D is None else y + D.unsqueeze(-1) * u


def lti_convolution(u: torch.Tensor, K: torch.Tensor,
                    D: torch.Tensor | None = None) -> torch.Tensor:
    r"""The same system as a causal convolution, computed with the FFT in O(L log L).

    .. math:: y_t = \sum_{k=0}^{t} K_k\, u_{t-k} + D u_t

    Both signals are zero-padded to 2L so the FFT's circular convolution does not wrap
    around (any length ≥ 2L − 1 would do). A complex K (complex modes) gives a complex y,
    as :func:`lti_recurrence` does.

    Args: u (b, d, L); K (d, L) from :func:`ssm_kernel`; D (d,) or None.
    Returns y (b, d, L).
    """
    _check_u_D("lti_convolution", u, D)
    _tensors("lti_convolution", K=K)
    if K.shape != u.shape[1:]:
        raise ValueError(f"lti_convolution: K must be (d, L) = {tuple(u.shape[1:])}, "
                         f"got {tuple(K.shape)}")
    length = u.shape[-1]
    if length == 0:                                   # an empty sequence: an empty output
        return u * K.sum() if D is None else u * K.sum() + D.unsqueeze(-1) * u
    if u.is_complex() or K.is_complex():
        u_f, K_f = torch.fft.fft(u, n=2 * length), torch.fft.fft(K, n=2 * length)
        y = torch.fft.ifft(u_f * K_f, n=2 * length)[..., :length]
    else:
        u_f = torch.fft.rfft(u, n=2 * length)
        K_f = torch.fft.rfft(K, n=2 * length)
        y = torch.fft.irfft(u_f * K_f, n=2 * length)[..., :length]
    return y if D is None else y + D.unsqueeze(-1) * u


def s4d_real_init(d: int, n: int, *, dtype=torch.float32) -> torch.Tensor:
    r"""S4D-real initialisation of the diagonal of A: :math:`A_{i} = -(i + 1)`,
    i = 0 … n-1, in every channel.

    Mamba stores :math:`A_\text{log} = \log(-A)` and uses
    :math:`A = -\exp(A_\text{log})`, which stays negative (stable) whatever the
    optimiser does. Returns A (d, n).
    """
    _checks.ints("s4d_real_init", d=d, n=n)
    return -torch.arange(1, n + 1, dtype=dtype).repeat(d, 1)


def state_size(d: int, n: int, d_conv: int = 1) -> int:
    r"""Numbers a Mamba-style layer keeps between tokens at inference:
    :math:`d\,(n + d_\text{conv} - 1)`.

    Each of the d channels holds an n-dimensional SSM state and the last d_conv − 1
    inputs of its causal convolution (d_conv = 1: no convolution). It does not depend
    on the context length.
    """
    _checks.ints("state_size", d=d, n=n, d_conv=d_conv)
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
    B and C arrive grouped, (b, g, n, L) with g dividing d (each its own g): channel c reads group c // (d/g).
    The big (L, b, d, n) tensors are built time-first so each scan step reads contiguous memory.
    """

    @staticmethod
    def forward(ctx, u, delta, A, B, C, chunk):
        (b, d, length), gB, gC = u.shape, B.shape[1], C.shape[1]
        pad = -length % chunk
        steps = length + pad
        delta_t, du_t = (F.pad(t, (0, pad)).permute(2, 0, 1).contiguous() for t in (delta, delta * u))   # (L', b, d)
        B_t, C_t = (F.pad(t, (0, pad)).permute(3, 0, 1, 2).unsqueeze(3) for t in (B, C))                  # (L', b, g, 1, n)
        a = (delta_t.unsqueeze(-1) * A).exp_()                                                  # (L', b, d, n)
        x = (du_t.view(steps, b, gB, d // gB, 1) * B_t).view(steps, b, d, -1)
        h = _blocked_scan(a, x, chunk)
        y = (h.view(steps, b, gC, d // gC, -1) * C_t).sum(-1).view(steps, b, d)[:length].permute(1, 2, 0)
        ctx.save_for_backward(u, delta, A, B, C, a, h)
        ctx.chunk, ctx.length = chunk, length
        return y, h[length - 1]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y, grad_last):
        u, delta, A, B, C, a, h = ctx.saved_tensors
        (b, d, length), gB, gC, n = u.shape, B.shape[1], C.shape[1], A.shape[1]
        steps, pad = a.shape[0], a.shape[0] - length
        grouped = lambda t, g: t.view(steps, b, g, d // g, t.shape[-1])                         # (L', b, g, d/g, ·)
        gy_t = F.pad(grad_y, (0, pad)).permute(2, 0, 1).contiguous().unsqueeze(-1)              # (L', b, d, 1)
        B_t, C_t = (F.pad(t, (0, pad)).permute(3, 0, 1, 2).unsqueeze(3) for t in (B, C))        # (L', b, g, 1, n)
        delta_t, du_t = (F.pad(t, (0, pad)).permute(2, 0, 1).contiguous() for t in (delta, delta * u))
        grad_h = (grouped(gy_t, gC) * C_t).view(steps, b, d, n)
        grad_h[length - 1] += grad_last
        a_next = torch.cat([a[1:], torch.ones_like(a[:1])])
        g_x = _blocked_scan(a_next, grad_h, ctx.chunk, reverse=True)                            # ∂ℓ/∂x_t
        grad_C = grouped(gy_t, gC).transpose(-1, -2) @ grouped(h, gC)                           # (L', b, g, 1, n)
        grad_B = grouped(du_t.unsqueeze(-1), gB).transpose(-1, -2) @ grouped(g_x, gB)
        grad_du = (grouped(g_x, gB) @ B_t.transpose(-1, -2)).view(steps, b, d)                   # (L', b, d)
        h_prev = torch.cat([torch.zeros_like(h[:1]), h[:-1]])
        grad_log_a = g_x.mul_(a).mul_(h_prev)                                                    # g_x no longer needed
        grad_delta = (grad_log_a * A).sum(-1)
        grad_A = (grad_log_a * delta_t.unsqueeze(-1)).sum((0, 1))                                # pairwise sum: accurate
        back = lambda t: t[:length].permute(1, 2, 0)                                              # (L', b, d) -> (b, d, L)
        back_bc = lambda t: t.squeeze(3)[:length].permute(1, 2, 3, 0)                             # -> (b, g, n, L)
        grad_du = back(grad_du)
        return (grad_du * delta, back(grad_delta) + grad_du * u, grad_A, back_bc(grad_B), back_bc(grad_C), None)


_SCANS = {"sequential": _scan_sequential, "indexed": _scan_indexed, "logspace": _scan_logspace}


def _check_bc(name: str, t: torch.Tensor, b: int, d: int, n: int, length: int) -> None:
    """B or C: time-invariant (d, n), shared (b, n, L), or grouped (b, g, n, L) with g dividing d."""
    shape = tuple(t.shape)
    if shape in ((d, n), (b, n, length)):
        return
    if t.dim() == 4 and shape[0] == b and shape[2:] == (n, length) and shape[1] >= 1 and d % shape[1] == 0:
        return
    raise ValueError(f"{name} must have shape (b, n, L) = {(b, n, length)}, (d, n) = {(d, n)} or "
                     f"(b, g, n, L) = ({b}, g, {n}, {length}) with g dividing d = {d}; got {shape}")


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
    needed = {"delta": (b, d, length), "z": (b, d, length), "D": (d,), "delta_bias": (d,)}
    for name, t in (("delta", delta), ("z", z), ("D", D), ("delta_bias", delta_bias)):
        if t is not None and tuple(t.shape) != needed[name]:
            raise ValueError(f"{name} must have shape {needed[name]} (b, d, L, n = {b}, {d}, {length}, {n}), "
                             f"got {tuple(t.shape)}")
    _check_bc("B", B, b, d, n, length)
    _check_bc("C", C, b, d, n, length)
    if (A > 0).any():
        raise ValueError(f"selective_scan: A must be <= 0 (a stable system, as Mamba's A = -exp(A_log) is); "
                         f"got max A = {A.max().item():.3g}, which makes the state grow without bound")


def _grouped(t: torch.Tensor, b: int, d: int, length: int) -> torch.Tensor:
    """B or C in any accepted layout as (b, g, n, L): (b, n, L) is g = 1, (d, n) is g = d (repeated over time)."""
    if t.dim() == 2:
        return t.unsqueeze(0).unsqueeze(-1).expand(b, d, t.shape[1], length)
    return t.unsqueeze(1) if t.dim() == 3 else t


def _per_channel(t: torch.Tensor, d: int) -> torch.Tensor:
    """(b, g, n, L) → (b, d, L, n): every channel's own B_t (or C_t), a view where g = 1 or g = d."""
    t, g = t.transpose(2, 3), t.shape[1]
    return t if g == d else t.expand(-1, d, -1, -1) if g == 1 else t.repeat_interleave(d // g, dim=1)


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """The dtype :func:`selective_scan` computes in: float32, or float64 if any argument is float64.

    The dtype rule (as the Mamba authors' reference, ``selective_scan_ref``, does it): bf16 and
    fp16 inputs are upcast, the state and every sum are kept in at least float32, and the
    output is cast back to the dtype of ``u``. A low-precision state would carry a rounding
    error of about δ/(1 − a) (:func:`recurrence_rounding`), large exactly where the memory is
    long. The reference upcasts float64 to float32 too; this library keeps float64, so that the
    tests can compare its forms at 1e-12.
    """
    _checks.floats("compute_dtype", **{f"tensors[{i}]": t for i, t in enumerate(tensors)})
    wide = any(t is not None and t.dtype == torch.float64 for t in tensors)
    return torch.float64 if wide else torch.float32


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

    Dtypes (:func:`compute_dtype`): everything is computed in float32 (float64 if any argument
    is float64), and ``out`` is returned in the dtype of ``u``; the last state stays in the
    compute dtype, as the reference returns it.

    Args:
        u, delta, z: (b, d, L). A: (d, n), real, <= 0 (a stable system; Mamba's A = -exp(A_log)).
        B, C: (b, n, L), shared by the d channels (Mamba); (d, n), time-invariant (S4D); or
        (b, g, n, L), g groups of d/g channels each (Mamba-2's groups). D, delta_bias: (d,).
        return_last_state: also return :math:`h_{L-1}`, (b, d, n).
    Returns: out (b, d, L), and the last state if asked for.
    Raises: TypeError for non-tensors or integer tensors; ValueError, naming the
    argument, for a wrong shape, an A with a positive entry or a negative step Δ (the state
    would grow without bound and overflow to inf and NaN, in every method).
    """
    _check_scan(u, delta, A, B, C, D, z, delta_bias, method)
    chunk = _chunk_size(u.shape[-1], chunk)
    dtype_in, wide = u.dtype, compute_dtype(u, delta, A, B, C, D, z, delta_bias)
    u, delta, A, B, C, D, z, delta_bias = (t if t is None else t.to(wide)
                                           for t in (u, delta, A, B, C, D, z, delta_bias))
    if delta_bias is not None:
        delta = delta + delta_bias.unsqueeze(-1)
    if delta_softplus:
        delta = F.softplus(delta)
    if (delta < 0).any():
        raise ValueError(f"selective_scan: delta must be >= 0 (a step size, after delta_bias and any softplus), "
                         f"got min {delta.min().item():.3g}; pass delta_softplus=True for raw values")
    b, d, length = u.shape
    B, C = _grouped(B, b, d, length), _grouped(C, b, d, length)                  # (b, g, n, L)
    if method == "chunked":
        y, last = _ChunkedSelectiveScan.apply(u, delta, A, B, C, chunk)
    else:
        log_a = delta.unsqueeze(-1) * A.unsqueeze(1)                               # (b, d, L, n): Δ_t A ≤ 0
        x = (delta * u).unsqueeze(-1) * _per_channel(B, d)                         # (b, d, L, n): Δ_t B_t u_t
        h = _SCANS[method](log_a, x, chunk)
        y, last = (h * _per_channel(C, d)).sum(-1), h[:, :, -1]                    # y_t = C_t · h_t
    if D is not None:
        y = y + D.unsqueeze(-1) * u
    if z is not None:
        y = y * F.silu(z)
    y = y.to(dtype_in)
    return (y, last) if return_last_state else y


def scan_hbm_bytes(batch: int, d: int, length: int, n: int, *, io_bytes: int = 2,
                   state_bytes: int = 4) -> dict[str, int]:
    r"""HBM traffic of one selective-scan forward pass, in an IO model (bytes; a model, not a measurement).

    Both forms read u, Δ, z (b, d, L) and B, C (b, n, L) and write the output (b, d, L), at
    ``io_bytes`` per element (bf16: 2), and read A (d, n), D and the Δ bias (d,) in float32:

    .. math:: \text{fused} = (4bdL + 2bnL)\,\text{io} + 4(dn + 2d)

    That is the fused kernel of the Mamba paper (§3.3.2): Ā, B̄u and the states h, each
    (b, d, L, n), live only in on-chip SRAM. A *materialised* scan (one kernel per operation, as a
    PyTorch loop runs it) writes those three tensors to HBM and reads each back once, in
    ``state_bytes`` (the state is kept in float32):

    .. math:: \text{materialised} = \text{fused} + 6\,bdLn\,\text{state}

    Returns ``{"fused", "materialised", "state_tensor"}``; ``state_tensor`` = bdLn·state is the
    size of one (b, d, L, n) tensor, what autograd keeps per saved tensor for the backward
    (the fused kernel keeps none: it recomputes the states in the backward pass).
    """
    _checks.ints("scan_hbm_bytes", batch=batch, d=d, length=length, n=n, io_bytes=io_bytes,
                 state_bytes=state_bytes)
    fused = (4 * batch * d * length + 2 * batch * n * length) * io_bytes + 4 * (d * n + 2 * d)
    state_tensor = batch * d * length * n * state_bytes
    return {"fused": fused, "materialised": fused + 6 * state_tensor, "state_tensor": state_tensor}


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

    def __post_init__(self):
        """Sizes are positive ints, 0 < dt_min <= dt_max, method a scan method: checked here, not deep in nn.Linear."""
        _checks.ints("MambaConfig", d_model=self.d_model, d_state=self.d_state, d_conv=self.d_conv,
                     expand=self.expand)
        if self.dt_rank is not None:
            _checks.ints("MambaConfig", dt_rank=self.dt_rank)
        if not 0 < self.dt_min <= self.dt_max:
            raise ValueError(f"MambaConfig: dt_min and dt_max must satisfy 0 < dt_min <= dt_max, "
                             f"got dt_min = {self.dt_min}, dt_max = {self.dt_max}")
        _checks.at_least("MambaConfig", 0, dt_init_floor=self.dt_init_floor)
        if self.method not in SCAN_METHODS:
            raise ValueError(f"MambaConfig: method must be one of {SCAN_METHODS}, got {self.method!r}")

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
        """Zero state: the last d_conv − 1 conv inputs (b, d_inner, d_conv − 1), in the weights' dtype, and
        the SSM state (b, d_inner, n), in float32 (float64 for float64 weights), as the scan keeps it."""
        c, p = self.config, self.in_proj.weight
        return (p.new_zeros(batch, c.d_inner, c.d_conv - 1),
                p.new_zeros(batch, c.d_inner, c.d_state, dtype=compute_dtype(p)))

    def step(self, u_t: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        r"""One token: u_t (b, d_model) and a state → (out_t (b, d_model), new state). Constant cost per token.

        .. math:: h_t = e^{\Delta_t A} \odot h_{t-1} + \Delta_t B_t x_t, \qquad y_t = C_t^\top h_t + D x_t
        """
        if u_t.dim() != 2 or u_t.shape[-1] != self.config.d_model:
            raise ValueError(f"u_t must be (b, d_model={self.config.d_model}), got {tuple(u_t.shape)}")
        self._check_state(state, u_t.shape[0])
        conv_state, h = state
        x, z = self.in_proj(u_t).chunk(2, dim=-1)                                   # (b, d_inner)
        window = torch.cat([conv_state, x.unsqueeze(-1)], dim=-1)                   # (b, d_inner, d_conv)
        x = F.silu((window * self.conv1d.weight.squeeze(1)).sum(-1) + self.conv1d.bias)
        dt, B, C = self._ssm_inputs(x)
        wide = h.dtype                                                              # the scan's dtype rule
        x, z, dt, B, C = (t.to(wide) for t in (x, z, dt, B, C))
        delta = F.softplus(dt + self.dt_proj.bias.to(wide))                         # (b, d_inner)
        A = -self.A_log.to(wide).exp()
        h = torch.exp(delta.unsqueeze(-1) * A) * h + (delta * x).unsqueeze(-1) * B.unsqueeze(1)
        y = (h * C.unsqueeze(1)).sum(-1) + self.D.to(wide) * x
        return self.out_proj((y * F.silu(z)).to(u_t.dtype)), (window[..., 1:], h)

    def _check_state(self, state, batch: int) -> None:
        """state = (conv_state (b, d_inner, d_conv − 1), h (b, d_inner, n)), floating point, as init_state makes it."""
        c = self.config
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise TypeError(f"Mamba.step: state must be a pair (conv_state, h) as init_state returns it, "
                            f"got {type(state).__name__}")
        expected = [("state[0] (conv_state)", "d_conv − 1", (batch, c.d_inner, c.d_conv - 1)),
                    ("state[1] (h)", "n", (batch, c.d_inner, c.d_state))]
        for (name, last, shape), t in zip(expected, state):
            _checks.floats("Mamba.step", **{name: t})
            if tuple(t.shape) != shape:
                raise ValueError(f"Mamba.step: {name} must be (b, d_inner, {last}) = {shape}, "
                                 f"got {tuple(t.shape)}")

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
