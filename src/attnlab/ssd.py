r"""State space duality (SSD, Mamba-2): a scalar-decay SSM as a masked matrix, and its chunked form.

Read alongside: Dao and Gu 2024, "Transformers are SSMs: Generalized Models and Efficient
Algorithms Through Structured State Space Duality" (§3: SSMs as semiseparable matrices;
§4-5: structured masked attention and the duality of the scalar-identity SSM; §6: the
hardware-efficient chunked algorithm).

Mamba-2 restricts the decay to one scalar per head and step, :math:`A_t = a_t I`. Per head,
with a state :math:`H_t \in \mathbb R^{n \times p}`,

.. math::
    H_t = a_t H_{t-1} + B_t x_t^\top, \qquad y_t = H_t^\top C_t, \qquad H_{-1} = 0,

which unrolls to :math:`y_t = \sum_{s \le t} (C_t \cdot B_s) \bigl(\prod_{k=s+1}^{t} a_k\bigr) x_s`,
so :math:`y = M x` with the masked matrix

.. math:: M = L \circ (C B^\top), \qquad L_{ts} = \prod_{k=s+1}^{t} a_k \ (s \le t), \quad 0 \ (s > t).

That is causal attention with queries C, keys B, values x and the mask L in place of the
softmax. With :math:`a_t = 1`, L is the causal mask of ones and SSD is causal linear attention
(unnormalised, no feature map). The three forms here compute the same function:

* :func:`ssd_recurrent`: one step per token (the definition);
* :func:`ssd_quadratic`: the (L, L) matrix M, then M x: the "attention" form;
* :func:`ssd_chunked`: the quadratic form inside chunks of T tokens, the recurrence between
  them (one state per chunk); linear in L.

Shape letters (as in Mamba-2's minimal SSD listing):

    b   batch
    L   sequence length
    h   heads
    p   head dimension (channels per head; x's last axis)
    g   groups of heads sharing B and C (g divides h; g = 1: every head shares them)
    n   state size

Arguments: x (b, L, h, p); log_a (b, L, h), :math:`\log a_t = \Delta_t A \le 0`; B, C (b, L, g, n).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _checks

SSD_METHODS = ("recurrent", "quadratic", "chunked")


def _check(fn: str, x, log_a, B, C, initial_state=None) -> None:
    _checks.floats(fn, x=x, log_a=log_a, B=B, C=C, initial_state=initial_state)
    if x.dim() != 4 or x.shape[1] == 0:
        raise ValueError(f"{fn}: x must be (b, L, h, p) with L >= 1, got shape {tuple(x.shape)}")
    b, length, h, p = x.shape
    if tuple(log_a.shape) != (b, length, h):
        raise ValueError(f"{fn}: log_a must have shape (b, L, h) = {(b, length, h)}, got {tuple(log_a.shape)}")
    for name, t in (("B", B), ("C", C)):
        if t.dim() != 4 or tuple(t.shape[:2]) != (b, length) or h % t.shape[2]:
            raise ValueError(f"{fn}: {name} must have shape (b, L, g, n) = ({b}, {length}, g, n) with g "
                             f"dividing h = {h}, got {tuple(t.shape)}")
    if B.shape != C.shape:
        raise ValueError(f"{fn}: B and C must have the same shape, got {tuple(B.shape)} and {tuple(C.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (b, h, B.shape[-1], p):
        raise ValueError(f"{fn}: initial_state must have shape (b, h, n, p) = {(b, h, B.shape[-1], p)}, "
                         f"got {tuple(initial_state.shape)}")
    if not log_a.is_meta and (log_a > 0).any():                   # meta tensors (FLOP counts) hold no values
        raise ValueError(f"{fn}: log_a must be <= 0 (a decay a_t = e^log_a in (0, 1]), got max {log_a.max().item():.3g}")


def _heads(t: torch.Tensor, h: int) -> torch.Tensor:
    """(b, L, g, n) → (b, L, h, n): head i reads group i // (h/g)."""
    return t if t.shape[2] == h else t.repeat_interleave(h // t.shape[2], dim=2)


def segsum(log_a: torch.Tensor) -> torch.Tensor:
    r"""Segment sums of log decays: (..., L) → (..., L, L), :math:`S_{ts} = \sum_{k=s+1}^{t} \log a_k` for s ≤ t.

    Entries above the diagonal (s > t) are −∞, so ``segsum(log_a).exp()`` is the mask L of SSD,
    zero in the future. Each entry is summed directly over its own segment, not as a difference
    of two prefix sums (:math:`\Lambda_t - \Lambda_s`), which would cancel catastrophically when
    both are large and the segment is short.
    """
    _checks.floats("segsum", log_a=log_a)
    if log_a.dim() < 1:
        raise ValueError(f"segsum: log_a must have a last (time) axis, got shape {tuple(log_a.shape)}")
    length = log_a.shape[-1]
    strictly_below = torch.ones(length, length, dtype=torch.bool, device=log_a.device).tril(-1)
    terms = log_a.unsqueeze(-1).expand(*log_a.shape, length).masked_fill(~strictly_below, 0)   # [k, s] = log a_k if k > s
    sums = terms.cumsum(-2)                                                                    # Σ_{s<k≤t} log a_k
    causal = torch.ones(length, length, dtype=torch.bool, device=log_a.device).tril()
    return sums.masked_fill(~causal, float("-inf"))


def ssd_matrix(log_a: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    r"""SSD's masked matrix :math:`M = L \circ (C B^\top)`, (b, h, L, L), with :math:`L = e^{\text{segsum}(\log a)}`.

    Args: log_a (b, L, h); B, C (b, L, g, n). Row t holds the weight of every x_s in y_t.
    """
    _checks.floats("ssd_matrix", log_a=log_a, B=B, C=C)
    if log_a.dim() != 3 or B.dim() != 4 or B.shape != C.shape or B.shape[:2] != log_a.shape[:2] \
            or log_a.shape[2] % B.shape[2]:
        raise ValueError(f"ssd_matrix: log_a must be (b, L, h) and B, C (b, L, g, n) with g dividing h; "
                         f"got {tuple(log_a.shape)}, {tuple(B.shape)}, {tuple(C.shape)}")
    h = log_a.shape[2]
    Bh, Ch = (_heads(t, h).transpose(1, 2) for t in (B, C))                    # (b, h, L, n)
    return segsum(log_a.transpose(1, 2)).exp() * (Ch @ Bh.transpose(-1, -2))


def ssd_recurrent(x: torch.Tensor, log_a: torch.Tensor, B: torch.Tensor, C: torch.Tensor, *,
                  initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The definition, one step per token: :math:`H_t = a_t H_{t-1} + B_t x_t^\top`, :math:`y_t = H_t^\top C_t`.

    Args: x (b, L, h, p); log_a (b, L, h); B, C (b, L, g, n); initial_state (b, h, n, p) or None (zeros).
    Returns: y (b, L, h, p) and the final state (b, h, n, p).
    """
    _check("ssd_recurrent", x, log_a, B, C, initial_state)
    b, length, h, p = x.shape
    Bh, Ch = _heads(B, h), _heads(C, h)
    H = x.new_zeros(b, h, B.shape[-1], p) if initial_state is None else initial_state
    ys = []
    for x_t, a_t, B_t, C_t in zip(x.unbind(1), log_a.exp().unbind(1), Bh.unbind(1), Ch.unbind(1)):
        H = a_t[..., None, None] * H + B_t.unsqueeze(-1) * x_t.unsqueeze(-2)   # (b, h, n, p)
        ys.append((C_t.unsqueeze(-1) * H).sum(-2))                              # (b, h, p)
    return torch.stack(ys, dim=1), H


def ssd_quadratic(x: torch.Tensor, log_a: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    r"""The attention form: :math:`y = (L \circ C B^\top)\, x`, with the (L, L) matrix of :func:`ssd_matrix`.

    :math:`2L^2(n + p)` FLOPs per batch element and head (two matrix products), O(L²) memory.
    Args: x (b, L, h, p); log_a (b, L, h); B, C (b, L, g, n). Returns y (b, L, h, p).
    """
    _check("ssd_quadratic", x, log_a, B, C)
    h = x.shape[2]
    M = ssd_matrix(log_a, B, C)                                              # (b, h, L, L)
    return (M @ x.transpose(1, 2)).transpose(1, 2)


def ssd_chunked(x: torch.Tensor, log_a: torch.Tensor, B: torch.Tensor, C: torch.Tensor, *, chunk: int = 64,
                initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The chunked SSD algorithm (Dao and Gu 2024, §6): quadratic inside chunks, recurrent between them.

    Cut the sequence into chunks of T tokens (the last one padded with :math:`a = 1`, x = 0).
    With :math:`\Lambda_t` the cumulative log decay inside a chunk:

    1. *inside each chunk*, the quadratic form: :math:`y^\text{diag} = (L \circ C B^\top) x`;
    2. *each chunk's own state*, what its tokens leave at its end:
       :math:`S = \sum_s e^{\Lambda_{T-1} - \Lambda_s} B_s x_s^\top`;
    3. *between chunks*, the recurrence over chunk boundaries:
       :math:`H_\text{in}^{(c+1)} = e^{\Lambda^{(c)}_{T-1}} H_\text{in}^{(c)} + S^{(c)}`
       (L/T steps);
    4. *the state's contribution*: :math:`y^\text{off}_t = e^{\Lambda_t}\, H_\text{in}^\top C_t`.

    Every exponent is ≤ 0. :math:`2L'T(n + p) + 4L'np` FLOPs per batch element and head, with
    L' = L rounded up to a multiple of T (:func:`ssd_flops`).

    Args: x (b, L, h, p); log_a (b, L, h); B, C (b, L, g, n); chunk T >= 1; initial_state
    (b, h, n, p) or None. Returns y (b, L, h, p) and the final state (b, h, n, p).
    """
    _check("ssd_chunked", x, log_a, B, C, initial_state)
    _checks.ints("ssd_chunked", chunk=chunk)
    b, length, h, p = x.shape
    pad = -length % chunk
    c = (length + pad) // chunk
    Bh, Ch = _heads(B, h), _heads(C, h)
    # (b, h, c, T, ·): heads first, then chunks, then time inside the chunk
    xs, Bs, Cs = (F.pad(t, (0, 0, 0, 0, 0, pad)).view(b, c, chunk, h, -1).permute(0, 3, 1, 2, 4)
                  for t in (x, Bh, Ch))
    la = F.pad(log_a, (0, 0, 0, pad)).view(b, c, chunk, h).permute(0, 3, 1, 2)   # (b, h, c, T)
    cum = la.cumsum(-1)                                                          # Λ_t inside each chunk
    y_diag = (segsum(la).exp() * (Cs @ Bs.transpose(-1, -2))) @ xs             # 1. (b, h, c, T, p)
    S = (Bs * (cum[..., -1:] - cum).exp().unsqueeze(-1)).transpose(-1, -2) @ xs  # 2. (b, h, c, n, p)
    H = x.new_zeros(b, h, B.shape[-1], p) if initial_state is None else initial_state
    entering = []
    for k in range(c):                                                           # 3. L/T steps
        entering.append(H)
        H = cum[:, :, k, -1, None, None].exp() * H + S[:, :, k]
    y_off = (Cs * cum.exp().unsqueeze(-1)) @ torch.stack(entering, dim=2)        # 4. (b, h, c, T, p)
    y = (y_diag + y_off).permute(0, 2, 3, 1, 4).reshape(b, c * chunk, h, p)[:, :length]
    return y, H


def ssd(x: torch.Tensor, log_a: torch.Tensor, B: torch.Tensor, C: torch.Tensor, *, method: str = "chunked",
        chunk: int = 64) -> torch.Tensor:
    """SSD by one of :data:`SSD_METHODS` ("recurrent", "quadratic", "chunked"); all compute the same y (b, L, h, p)."""
    if method not in SSD_METHODS:
        raise ValueError(f"ssd: method must be one of {SSD_METHODS}, got {method!r}")
    if method == "recurrent":
        return ssd_recurrent(x, log_a, B, C)[0]
    if method == "quadratic":
        return ssd_quadratic(x, log_a, B, C)
    return ssd_chunked(x, log_a, B, C, chunk=chunk)[0]


def ssd_flops(length: int, n: int, p: int, chunk: int | None = None) -> int:
    r"""Matrix-product FLOPs of SSD per batch element and head (2 per multiply-add, as torch counts them).

    chunk None: the quadratic form, :math:`2L^2 n + 2L^2 p` (C Bᵀ, then M x). A chunk T: the
    chunked form, :math:`2L'T(n + p)` inside the chunks plus :math:`2L'np` for the chunk states
    and :math:`2L'np` for their read-out, with :math:`L' = T\lceil L/T \rceil`. The mask, the
    exponentials and the L/T-step recurrence between chunks are elementwise and not counted.
    """
    _checks.ints("ssd_flops", length=length, n=n, p=p)
    if chunk is None:
        return 2 * length * length * (n + p)
    _checks.ints("ssd_flops", chunk=chunk)
    padded = -(-length // chunk) * chunk
    return 2 * padded * chunk * (n + p) + 4 * padded * n * p
