"""FlashAttention in PyTorch: tiles, the online softmax, and a backward that recomputes.

Read alongside: Milakov & Gimelshein 2018, "Online normalizer calculation for softmax";
Dao et al. 2022, "FlashAttention" (Algorithms 1 and 2, Theorem 2); Dao 2023,
"FlashAttention-2" (the loop order and the log-sum-exp saved for the backward pass).

Shapes as in :mod:`attnlab.attention`: q (b, h, n, d), k and v (b, h_kv, m, d).
Tiles: block_q queries by block_k keys; no n x m matrix exists in either pass. The loop
order is FlashAttention-2's (outer loop over query blocks, normalisation deferred to the
end). This is a teaching implementation in plain PyTorch: on a CPU it saves memory, not
time; on a GPU the same loop order is what a fused kernel runs in on-chip SRAM
(:mod:`attnlab.kernels` has one in Triton). The IO model counts HBM accesses for each
paper's loop order with its own tile rule:
:func:`hbm_accesses_flash` (FlashAttention-1, outer loop over K/V blocks) and
:func:`hbm_accesses_flash2` (FlashAttention-2, outer loop over query blocks).
"""
from __future__ import annotations

import math

import torch

from . import _checks
from .attention import _check_shapes, repeat_kv

DEFAULT_BLOCK = 256  # benchmarks/flash_tiles.py: the fastest tiles on a 2-core CPU


def _zero_if_neginf(x: torch.Tensor) -> torch.Tensor:
    """A running max still at -inf (no key seen) becomes 0: exp(s - m) stays defined."""
    return torch.where(torch.isneginf(x), torch.zeros_like(x), x)


def online_softmax(x: torch.Tensor, block: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Softmax over the last axis, reading it ``block`` entries at a time.

    Keeps a running maximum m and normaliser ℓ; for each new block s:

    .. math:: m' = \max(m, \max_j s_j), \qquad
              \ell' = e^{m - m'}\ell + \sum_j e^{s_j - m'}

    Returns (softmax (..., m), final max (...,), final normaliser (...,)); the softmax
    uses the final m and ℓ, which is what a second pass (or FlashAttention's rescaled
    output) needs.
    """
    _checks.floats("online_softmax", x=x)
    _checks.ints("online_softmax", block=block)
    like = dict(dtype=x.dtype, device=x.device)
    running_max = torch.full(x.shape[:-1], float("-inf"), **like)
    normaliser = torch.zeros(x.shape[:-1], **like)
    for start in range(0, x.shape[-1], block):
        s = x[..., start:start + block]
        new_max = torch.maximum(running_max, s.amax(-1))
        safe = _zero_if_neginf(new_max)
        normaliser = (normaliser * torch.exp(running_max - safe)
                      + torch.exp(s - safe.unsqueeze(-1)).sum(-1))
        running_max = new_max
    safe = _zero_if_neginf(running_max)
    tiny = torch.finfo(x.dtype).tiny                 # a row of -inf only: 0 / tiny = 0
    probs = torch.exp(x - safe.unsqueeze(-1)) / normaliser.clamp_min(tiny).unsqueeze(-1)
    return probs, running_max, normaliser


def _tile_scores(q, k, q0, q1, k0, k1, needs_mask, scale):
    """Scores of one tile, (b, h, q1 - q0, k1 - k0), causal-masked (j <= i + m - n) if
    needed."""
    s = q[..., q0:q1, :] @ k[..., k0:k1, :].transpose(-2, -1) * scale
    if needs_mask:
        i = torch.arange(q0, q1, device=q.device).unsqueeze(-1)
        j = torch.arange(k0, k1, device=q.device)
        s = s.masked_fill(j > i + (k.shape[-2] - q.shape[-2]), float("-inf"))
    return s


def _tiles(n: int, m: int, block_q: int, block_k: int, causal: bool):
    """Yield (q0, q1, k0, k1, needs_mask) for each tile with an allowed entry."""
    offset = m - n
    for q0 in range(0, n, block_q):
        q1 = min(q0 + block_q, n)
        for k0 in range(0, m, block_k):
            k1 = min(k0 + block_k, m)
            if causal and k0 > q1 - 1 + offset:
                break                    # this tile and every later one is fully masked
            yield q0, q1, k0, k1, causal and k1 - 1 > q0 + offset


def _forward(q, k, v, scale, causal, block_q, block_k, trace=None):
    """Tiled forward: the output (b, h, n, d_v) and the log-sum-exp per row (b, h, n).

    If ``trace`` is a list, a snapshot of the running state is appended after each tile.
    """
    n, m = q.shape[-2], k.shape[-2]
    like = dict(dtype=q.dtype, device=q.device)
    out = torch.zeros(*q.shape[:-1], v.shape[-1], **like)
    row_max = torch.full(q.shape[:-1], float("-inf"), **like)
    row_sum = torch.zeros(q.shape[:-1], **like)
    for q0, q1, k0, k1, needs_mask in _tiles(n, m, block_q, block_k, causal):
        s = _tile_scores(q, k, q0, q1, k0, k1, needs_mask, scale)   # (b, h, Bq, Bk)
        m_old = row_max[..., q0:q1]
        m_new = torch.maximum(m_old, s.amax(-1))
        m_safe = _zero_if_neginf(m_new)
        p = torch.exp(s - m_safe.unsqueeze(-1))
        correction = torch.exp(m_old - m_safe)
        row_sum[..., q0:q1] = row_sum[..., q0:q1] * correction + p.sum(-1)
        out[..., q0:q1, :] = (out[..., q0:q1, :] * correction.unsqueeze(-1)
                              + p @ v[..., k0:k1, :])
        row_max[..., q0:q1] = m_new
        if trace is not None:
            tiny = torch.finfo(row_sum.dtype).tiny
            trace.append({"tile": (q0, q1, k0, k1), "p": p.clone(),
                          "row_max": row_max.clone(), "row_sum": row_sum.clone(),
                          "out": out / row_sum.clamp_min(tiny).unsqueeze(-1)})
    empty = row_sum == 0                                    # no allowed key at all
    out = out / torch.where(empty, torch.ones_like(row_sum), row_sum).unsqueeze(-1)
    lse = torch.where(empty, torch.full_like(row_sum, float("inf")),
                      row_max + torch.log(row_sum))
    return out, lse


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, block_q, block_k):
        out, lse = _forward(q, k, v, scale, causal, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.config = (scale, causal, block_q, block_k)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        r"""Recompute each tile's probabilities from the saved log-sum-exp, then

        .. math:: dV_j \mathrel{+}= P^\top dO_i, \quad dP = dO_i V_j^\top, \quad
                  dS = P \odot (dP - D_i), \\
                  dQ_i \mathrel{+}= dS\,K_j\,c, \quad dK_j \mathrel{+}= dS^\top Q_i\,c

        with :math:`D_i = \mathrm{rowsum}(dO_i \odot O_i)` and c the scale.
        """
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal, block_q, block_k = ctx.config
        n, m = q.shape[-2], k.shape[-2]
        grad_out = grad_out.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (grad_out * out).sum(-1)                            # D_i, (b, h, n)
        for q0, q1, k0, k1, needs_mask in _tiles(n, m, block_q, block_k, causal):
            qi, kj, vj = q[..., q0:q1, :], k[..., k0:k1, :], v[..., k0:k1, :]
            s = _tile_scores(q, k, q0, q1, k0, k1, needs_mask, scale)
            p = torch.exp(s - lse[..., q0:q1].unsqueeze(-1))        # exact P
            do = grad_out[..., q0:q1, :]
            dv[..., k0:k1, :] += p.transpose(-2, -1) @ do
            ds = p * (do @ vj.transpose(-2, -1) - delta[..., q0:q1].unsqueeze(-1))
            dq[..., q0:q1, :] += ds @ kj * scale
            dk[..., k0:k1, :] += ds.transpose(-2, -1) @ qi * scale
        return dq, dk, dv, None, None, None, None


def _check_same_heads(fn: str, q: torch.Tensor, k: torch.Tensor) -> None:
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"{fn}: k must have q's leading axes {tuple(q.shape[:-2])} "
                         f"(h_kv = h), got {tuple(k.shape)}")


def _blocks(fn: str, block_q: int | None, block_k: int | None) -> tuple[int, int]:
    """The tile sizes, ``DEFAULT_BLOCK`` where None; each must be a positive int."""
    block_q = DEFAULT_BLOCK if block_q is None else block_q
    block_k = DEFAULT_BLOCK if block_k is None else block_k
    _checks.ints(fn, block_q=block_q, block_k=block_k)
    return block_q, block_k


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
    block_q: int | None = None, block_k: int | None = None, scale: float | None = None,
) -> torch.Tensor:
    r"""Exact attention computed tile by tile, forward and backward, never forming the
    n x m matrix.

    .. math:: O = \mathrm{softmax}(QK^\top c)\,V, \quad c = 1/\sqrt{d}
              \text{ by default}

    Args:
        q: (b, h, n, d); k: (b, h_kv, m, d); v: (b, h_kv, m, d_v); h_kv divides h (GQA).
        causal: bottom-right aligned causal mask (query i sees keys j <= i + m - n);
            tiles that are fully masked are skipped.
        block_q, block_k: tile sizes (default ``DEFAULT_BLOCK``); any n and m work.
        scale: multiplies the scores; default 1 / sqrt(d).
    Returns: (b, h, n, d_v). A query with no allowed key gets zeros.
    Raises: TypeError for integer q, k, v; ValueError for shapes that do not fit or
        block sizes < 1.
    """
    _check_shapes(q, k, v, "flash_attention")
    if q.dim() != 4:
        raise ValueError("flash_attention: q must have shape (b, h, n, d), "
                         f"got {tuple(q.shape)}")
    block_q, block_k = _blocks("flash_attention", block_q, block_k)
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # autograd sums the copies
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _FlashAttention.apply(q, k, v, scale, causal, block_q, block_k)


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                  causal: bool = False, block_q: int | None = None,
                  block_k: int | None = None, scale: float | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The tiled forward alone (no autograd), with the log-sum-exp beside the output.

    .. math:: \ell_i = \log \sum_{j \text{ allowed}} e^{c\, q_i \cdot k_j}

    which is what partial results over disjoint key blocks need to be merged exactly
    (ring attention, chapter 14). Shapes as in :func:`flash_attention` with h_kv = h;
    returns out (b, h, n, d_v) and lse (b, h, n), +inf for a row with no allowed key
    (its output is 0).
    """
    _check_shapes(q, k, v, "flash_forward")
    _check_same_heads("flash_forward", q, k)
    block_q, block_k = _blocks("flash_forward", block_q, block_k)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _forward(q, k, v, scale, causal, block_q, block_k)


def flash_trace(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                causal: bool = False, block_q: int = 4, block_k: int = 4
                ) -> tuple[torch.Tensor, list[dict]]:
    """Run the tiled forward; return (output, one snapshot per tile), for replays.

    Each snapshot holds the tile's bounds, ``"p"``: what the kernel holds for that tile,
    P̃ = exp(S_ij − m_new) (b, h, B_q, B_k), unnormalised and relative to the running
    maximum after the tile, and the running max m, normaliser ℓ and output (normalised
    by the ℓ so far) of every row, after that tile. Shapes as in :func:`flash_attention`
    with h_kv = h.
    """
    _check_shapes(q, k, v, "flash_trace")
    _check_same_heads("flash_trace", q, k)
    _checks.ints("flash_trace", block_q=block_q, block_k=block_k)
    trace: list[dict] = []
    scale = 1.0 / math.sqrt(q.shape[-1])
    out, _ = _forward(q, k, v, scale, causal, block_q, block_k, trace)
    return out, trace


def hbm_accesses_standard(n: int, d: int) -> int:
    r"""HBM reads and writes (elements) of standard attention (Dao et al. 2022, Alg. 0):

    read Q, K (2nd), write S (n²); read S, write P (2n²); read P, V (n² + nd), write O
    (nd): 4nd + 4n², which is Θ(nd + n²).
    """
    _checks.at_least("hbm_accesses_standard", 0, n=n, d=d)
    return 4 * n * d + 4 * n * n


def fa1_block_sizes(sram: int, d: int) -> tuple[int, int]:
    r"""FlashAttention-1's tiles for an SRAM of ``sram`` elements (Dao et al. 2022).

    .. math:: B_c = \lceil M / 4d \rceil, \qquad B_r = \min(\lceil M / 4d \rceil, d)

    so K_j and V_j take about M/4 each and the score tile B_r × B_c at most M/4. Q_i and
    O_i (2 B_r d) are outside that budget, so the working set 2B_c d + 2B_r d + B_r B_c
    can exceed M (at M = 98,304 and d = 128 it is 106,496): the rule fits M up to a
    constant, which is all the asymptotic Theorem 2 needs.
    Returns (B_r, B_c): query rows and key columns per tile.
    """
    _checks.at_least("fa1_block_sizes", 1, sram=sram, d=d)
    block_c = math.ceil(sram / (4 * d))
    return min(block_c, d), block_c


def fa2_block_sizes(sram: int, d: int) -> tuple[int, int]:
    r"""Square tiles for FlashAttention-2's loop order: the largest B with B² + 4Bd ≤ M.

    The working set of one step is Q_i and the accumulator O_i (B_r·d each), K_j and V_j
    (B_c·d each) and the score tile (B_r·B_c); with B_r = B_c = B that is B² + 4Bd
    elements. This rule is the book's model, not the paper's (FlashAttention-2 picks
    B_r, B_c from {64, 128} by hand for each head dimension, its accumulator and score
    tile held in registers). Returns (B_r, B_c) = (B, B), at least 1.
    """
    _checks.at_least("fa2_block_sizes", 1, sram=sram, d=d)
    block = math.isqrt(4 * d * d + sram) - 2 * d
    while block > 1 and block * block + 4 * block * d > sram:  # stay inside M
        block -= 1
    return max(block, 1), max(block, 1)


def hbm_accesses_flash(n: int, d: int, sram: int) -> int:
    r"""HBM reads and writes (elements) of FlashAttention-1's forward (Dao et al. 2022).

    Tiles from :func:`fa1_block_sizes`. The loop order is FlashAttention-1's (their
    Algorithm 1): the **outer** loop runs over the T_c = ⌈n / B_c⌉ key/value blocks, the
    inner loop over the query blocks. Counted line by line: initialise O, ℓ, m in HBM
    (nd + 2n, line 2); load every K_j, V_j once (2nd in all, line 6); and on each of the
    T_c outer passes, for every query block, load Q_i, O_i, ℓ_i, m_i and write O_i, ℓ_i,
    m_i back (lines 8, 12, 13): 3nd + 4n per pass.

    .. math:: \text{total} = nd + 2n + 2nd + \lceil n / B_c \rceil\,(3nd + 4n)
              = \Theta(n^2 d^2 / M) \text{ once } M \ge 4d

    (Theorem 2); against standard attention's 4nd + 4n² the ratio tends to M / 3d² for
    large n.
    """
    _checks.at_least("hbm_accesses_flash", 0, n=n)
    _checks.at_least("hbm_accesses_flash", 1, d=d, sram=sram)
    _, block_c = fa1_block_sizes(sram, d)
    passes = math.ceil(n / block_c)
    return (n * d + 2 * n) + 2 * n * d + passes * (3 * n * d + 4 * n)


def hbm_accesses_flash2(n: int, d: int, sram: int, *,
                        block_r: int | None = None) -> int:
    r"""HBM reads and writes (elements) of FlashAttention-2's forward (Dao 2023).

    Tiles from :func:`fa2_block_sizes`, unless ``block_r`` gives the query rows per
    block (FlashAttention-2 itself uses 64 or 128). The loop order is the one of
    FlashAttention-2 and :func:`flash_attention`: the **outer** loop runs over the
    T_r = ⌈n / B_r⌉ query blocks; Q_i, its accumulator and its statistics stay on chip,
    while all of K and V stream past it once per query block. Read Q once (nd), read K
    and V T_r times (2nd each time), write O and the log-sum-exp L once (nd + n):

    .. math:: \text{total} = 2nd + n + \lceil n / B_r \rceil \, 2nd
              = \Theta(n^2 d / B_r)

    so the traffic is set by B_r, the number of query rows that share one read of K and
    V, and the forward's arithmetic intensity, 4n²d FLOPs over 2 bytes per element, is
    about B_r FLOPs per byte. The model has no cache between HBM and SRAM (a GPU's L2).
    """
    _checks.at_least("hbm_accesses_flash2", 0, n=n)
    _checks.at_least("hbm_accesses_flash2", 1, d=d, sram=sram)
    if block_r is None:
        block_r, _ = fa2_block_sizes(sram, d)
    else:
        _checks.at_least("hbm_accesses_flash2", 1, block_r=block_r)
    return 2 * n * d + n + math.ceil(n / block_r) * 2 * n * d
