"""Linear attention: replace exp(q·k) by a feature-map inner product, and attention becomes an RNN.

Read alongside: Katharopoulos et al. 2020, "Transformers are RNNs" (elu + 1, the recurrent
form); Choromanski et al. 2021, "Rethinking Attention with Performers" (FAVOR+ positive
orthogonal random features); Yang et al. 2024, "Gated Linear Attention Transformers with
Hardware-Efficient Training" (data-dependent decay, chunkwise form).

Shapes: q, k (b, h, n, d); v (b, h, n, d_v); feature maps send d to m features.
Every form is exact against its parallel (quadratic) reference; only the feature map
approximates softmax attention.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import _checks

METHODS = ("parallel", "recurrent", "chunked")


def elu_feature(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1 > 0 (Katharopoulos et al.)."""
    _checks.floats("elu_feature", x=x)
    return F.elu(x) + 1


def relu_feature(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = relu(x); rows can be all zero, so the normaliser is guarded."""
    _checks.floats("relu_feature", x=x)
    return F.relu(x)


def orthogonal_gaussian(m: int, d: int, *, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """(m, d) random features: blocks of orthogonal rows, each rescaled to a chi(d)-distributed norm.

    Each block is Q from the QR decomposition G = QR of a Gaussian (d, d) matrix, with Q's
    columns multiplied by sign(diag R). Without that sign fix, Q's signs follow the QR routine's
    fixed sign convention for R (ω[0, 0] < 0 on every seed), the directions are not uniform on
    the sphere, and the FAVOR+ estimate of exp(q·k/√d) is biased. With it, Q is Haar-distributed
    (Mezzadri 2007) and each row of ω is marginally N(0, I_d): E[φ(q)·φ(k)] = exp(q·k/√d).
    """
    _checks.ints("orthogonal_gaussian", m=m, d=d)
    g = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(math.ceil(m / d)):
        qmat, rmat = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
        qmat = qmat * torch.sign(torch.diagonal(rmat))  # Haar, not biased by QR's convention
        blocks.append(qmat.T)
    omega = torch.cat(blocks)[:m]
    norms = torch.randn(m, d, generator=g, dtype=torch.float64).norm(dim=-1, keepdim=True)
    return (omega * norms).to(dtype)


def favor_feature(x: torch.Tensor, omega: torch.Tensor, *, stabilise: str | None = None) -> torch.Tensor:
    r"""FAVOR+ positive random features for the softmax kernel exp(q·k/√d):

    .. math:: \phi(x) = \frac{1}{\sqrt m} \exp\!\big(\omega^\top \tilde x - \|\tilde x\|^2 / 2 - c\big),
              \quad \tilde x = x / d^{1/4}

    With c = 0 (``stabilise=None``), E[φ(q)·φ(k)] = exp(q·k/√d). omega: (m, d) from
    :func:`orthogonal_gaussian`. At large ‖x‖ the exponent leaves float32's range (e^x is 0
    below x ≈ −103 and inf above ≈ 88.7), and a query whose features all underflow gives 0/0.
    ``stabilise="row"`` subtracts each row's largest exponent (c differs per token: use it for
    queries), ``stabilise="all"`` the largest over the last two axes (one c per (…, n, m) slice:
    use it for keys). Every feature is then ≤ 1/√m. The kernel is scaled by e^{−c_q − c_k}, a
    factor that the normalised attention output cancels (Performer's implementation does the same).
    This widens the usable range; it cannot help once the kernel values themselves span more
    than float32's range.
    """
    _checks.floats("favor_feature", x=x, omega=omega)
    if omega.dim() != 2 or omega.shape[-1] != x.shape[-1]:
        raise ValueError(f"favor_feature: omega must have shape (m, d={x.shape[-1]}), got {tuple(omega.shape)}")
    if stabilise not in (None, "row", "all"):
        raise ValueError(f"favor_feature: stabilise must be None, 'row' or 'all', got {stabilise!r}")
    x = x / x.shape[-1] ** 0.25
    exponent = x @ omega.T - x.square().sum(-1, keepdim=True) / 2
    if stabilise == "row":
        exponent = exponent - exponent.amax(-1, keepdim=True).detach()
    elif stabilise == "all":
        exponent = exponent - exponent.amax((-2, -1), keepdim=True).detach()
    return torch.exp(exponent) / math.sqrt(omega.shape[0])


def _features(name, omega):
    """(φ for queries, φ for keys)."""
    if name == "elu":
        return elu_feature, elu_feature
    if name == "relu":
        return relu_feature, relu_feature
    if name == "favor":
        if omega is None:
            raise ValueError("feature_map='favor' needs omega, e.g. orthogonal_gaussian(m, d)")
        return (lambda x: favor_feature(x, omega.to(x.dtype), stabilise="row"),
                lambda x: favor_feature(x, omega.to(x.dtype), stabilise="all"))
    raise ValueError(f"feature_map must be 'elu', 'relu' or 'favor', got {name!r}")


def _normalise(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return numerator / denominator.clamp_min(1e-12).unsqueeze(-1)


def _check_qkv(fn: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    _checks.floats(fn, q=q, k=k, v=v)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"{fn}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dim() != 4 or k.shape != q.shape or v.shape[:-1] != q.shape[:-1] or q.shape[-2] == 0:
        raise ValueError(f"{fn}: q, k, v must be (b, h, n, d), (b, h, n, d), (b, h, n, d_v) with the same b, h, n "
                         f"and n >= 1; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, feature_map: str = "elu",
                     causal: bool = False, method: str = "parallel", chunk: int = 64,
                     omega: torch.Tensor | None = None) -> torch.Tensor:
    r"""Linear attention in one of three equal forms.

    .. math:: o_i = \frac{\phi(q_i)^\top \sum_{j} \phi(k_j) v_j^\top}{\phi(q_i)^\top \sum_{j} \phi(k_j)}
              \quad (j \le i \text{ if causal})

    parallel: form the (n, n) matrix φ(Q)φ(K)ᵀ (the reference, O(n² m));
    recurrent: a state S_t = S_{t-1} + φ(k_t) v_tᵀ and z_t = z_{t-1} + φ(k_t), one step per token
    (O(n m d_v), constant memory per step);
    chunked: the parallel form inside chunks of ``chunk`` tokens and the state between them.
    Non-causal attention needs no recurrence: the sums run over all keys. FAVOR+ features are
    computed in the stabilised form of :func:`favor_feature` (per-query and per-slice maxima
    subtracted), which leaves the normalised output unchanged and cannot overflow.

    Raises: TypeError for integer q, k, v; ValueError for a bad method, chunk < 1, or shapes
    that are not (b, h, n, d) with the same b, h and n >= 1.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    _check_qkv("linear_attention", q, k, v)
    _checks.ints("linear_attention", chunk=chunk)
    phi_q, phi_k = _features(feature_map, omega)
    fq, fk = phi_q(q), phi_k(k)
    if not causal:
        state = fk.transpose(-2, -1) @ v                                     # (b, h, m, d_v)
        return _normalise(fq @ state, (fq * fk.sum(-2, keepdim=True)).sum(-1))
    if method == "parallel":
        scores = (fq @ fk.transpose(-2, -1)).tril()
        return _normalise(scores @ v, scores.sum(-1))
    if method == "recurrent":
        state = torch.zeros(*q.shape[:2], fk.shape[-1], v.shape[-1], dtype=q.dtype, device=q.device)
        norm = torch.zeros(*q.shape[:2], fk.shape[-1], dtype=q.dtype, device=q.device)
        outs = []
        for fq_t, fk_t, v_t in zip(fq.unbind(-2), fk.unbind(-2), v.unbind(-2)):
            state = state + fk_t.unsqueeze(-1) * v_t.unsqueeze(-2)
            norm = norm + fk_t
            outs.append(_normalise((fq_t.unsqueeze(-2) @ state).squeeze(-2), (fq_t * norm).sum(-1)))
        return torch.stack(outs, dim=-2)
    state = torch.zeros(*q.shape[:2], fk.shape[-1], v.shape[-1], dtype=q.dtype, device=q.device)
    norm = torch.zeros(*q.shape[:2], fk.shape[-1], dtype=q.dtype, device=q.device)
    outs = []
    for c0 in range(0, q.shape[-2], chunk):
        fq_c, fk_c, v_c = fq[..., c0:c0 + chunk, :], fk[..., c0:c0 + chunk, :], v[..., c0:c0 + chunk, :]
        intra = (fq_c @ fk_c.transpose(-2, -1)).tril()
        numerator = intra @ v_c + fq_c @ state
        denominator = intra.sum(-1) + (fq_c * norm.unsqueeze(-2)).sum(-1)
        outs.append(_normalise(numerator, denominator))
        state = state + fk_c.transpose(-2, -1) @ v_c
        norm = norm + fk_c.sum(-2)
    return torch.cat(outs, dim=-2)


GLA_METHODS = ("recurrent", "chunked", "chunked_matmul")


def _pairwise_gated(q: torch.Tensor, k: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Causal weights Σ_c q_tc k_sc e^{b_tc − b_sc} (s ≤ t) as a (…, C, C, d) product: every exponent ≤ 0."""
    size = q.shape[-2]
    causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    gaps = (b.unsqueeze(-2) - b.unsqueeze(-3)).masked_fill(~causal[..., None], float("-inf"))  # (b,h,C,C,d)
    return (q.unsqueeze(-2) * k.unsqueeze(-3) * gaps.exp()).sum(-1)                      # (b, h, C, C)


def _matmul_gated_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor,
                        sub_chunk: int) -> torch.Tensor:
    """The within-chunk output Σ_{s≤t} (Σ_c q_tc k_sc e^{b_tc − b_sc}) v_s by secondary chunking.

    Query sub-chunk [i0, i1) reads the earlier keys s < i0 of the chunk with one matrix product,
    (q ⊙ e^{b − b_r})(k ⊙ e^{b_r − b})ᵀ, where r = i0 − 1 is the boundary: both exponents are ≤ 0,
    so neither factor can overflow (the one-level form (q ⊙ e^{b})(k ⊙ e^{−b})ᵀ overflows once
    −b grows past ≈ 88 in float32). Keys inside the query's own sub-chunk use the pairwise form.
    """
    outs = []
    for i0 in range(0, q.shape[-2], sub_chunk):
        q_i, b_i = q[..., i0:i0 + sub_chunk, :], b[..., i0:i0 + sub_chunk, :]
        out = _pairwise_gated(q_i, k[..., i0:i0 + sub_chunk, :], b_i) @ v[..., i0:i0 + sub_chunk, :]
        if i0 > 0:
            ref = b[..., i0 - 1:i0, :]                                                     # (b, h, 1, d)
            q_tilde = q_i * (b_i - ref).exp()                                              # e^{≤ 0}
            k_tilde = k[..., :i0, :] * (ref - b[..., :i0, :]).exp()                        # e^{≤ 0}
            out = out + (q_tilde @ k_tilde.transpose(-2, -1)) @ v[..., :i0, :]
        outs.append(out)
    return torch.cat(outs, dim=-2)


def gated_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, *,
                           method: str = "recurrent", chunk: int = 16, sub_chunk: int = 4) -> torch.Tensor:
    r"""Gated linear attention (Yang et al. 2024): a matrix state that forgets, per key dimension.

    .. math:: S_t = \mathrm{diag}(\alpha_t)\, S_{t-1} + k_t v_t^\top, \qquad o_t = S_t^\top q_t,
              \qquad \alpha_t = \exp(\text{log\_decay}_t) \in (0, 1]^{d}

    The decay depends on the input (it is computed from the token), which is what separates
    GLA from plain linear attention (α = 1) and from a fixed exponential decay.

    recurrent: one step per token. chunked: within a chunk of C tokens, with cumulative log
    decays b_t, the pairwise weights :math:`\sum_d q_{td} k_{sd} e^{b_{td} - b_{sd}}` (s ≤ t) are
    formed directly as a (C, C, d) tensor, so every exponent is ≤ 0 (no overflow), and the state
    is carried between chunks. chunked_matmul: the hardware-efficient form of Yang et al. (§4):
    the same chunks, but inside a chunk the weights come from matrix products
    (q ⊙ e^{b − b_r})(k ⊙ e^{b_r − b})ᵀ between sub-chunks of ``sub_chunk`` tokens (secondary
    chunking, with r a sub-chunk boundary so both factors stay ≤ 1), and only the diagonal
    sub-chunks use the pairwise form. All three compute the same function.

    Args: q, k, log_decay: (b, h, n, d) with log_decay <= 0; v: (b, h, n, d_v). Causal by construction.

    Raises: TypeError for integer inputs; ValueError for a bad method, chunk or sub_chunk < 1,
    or shapes that do not match.
    """
    if method not in GLA_METHODS:
        raise ValueError(f"method must be one of {GLA_METHODS}, got {method!r}")
    _check_qkv("gated_linear_attention", q, k, v)
    _checks.floats("gated_linear_attention", log_decay=log_decay)
    _checks.ints("gated_linear_attention", chunk=chunk, sub_chunk=sub_chunk)
    if log_decay.shape != k.shape or (log_decay > 0).any():
        raise ValueError(f"log_decay must have k's shape {tuple(k.shape)} and be <= 0, got shape {tuple(log_decay.shape)}")
    state = torch.zeros(*q.shape[:2], k.shape[-1], v.shape[-1], dtype=q.dtype, device=q.device)
    if method == "recurrent":
        outs = []
        for q_t, k_t, v_t, a_t in zip(q.unbind(-2), k.unbind(-2), v.unbind(-2), log_decay.exp().unbind(-2)):
            state = a_t.unsqueeze(-1) * state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
            outs.append((q_t.unsqueeze(-2) @ state).squeeze(-2))
        return torch.stack(outs, dim=-2)
    outs = []
    for c0 in range(0, q.shape[-2], chunk):
        q_c, k_c, v_c = q[..., c0:c0 + chunk, :], k[..., c0:c0 + chunk, :], v[..., c0:c0 + chunk, :]
        b = log_decay[..., c0:c0 + chunk, :].cumsum(-2)                                   # (b, h, C, d)
        if method == "chunked":
            intra = _pairwise_gated(q_c, k_c, b) @ v_c                                    # (b, h, C, d_v)
        else:
            intra = _matmul_gated_chunk(q_c, k_c, v_c, b, sub_chunk)
        outs.append(intra + (q_c * b.exp()) @ state)
        last = b[..., -1:, :]
        state = last.transpose(-2, -1).exp() * state + (k_c * (last - b).exp()).transpose(-2, -1) @ v_c
    return torch.cat(outs, dim=-2)
