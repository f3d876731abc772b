"""Transfer questions of chapter 09: each answer computed with attnlab (see test_quiz_answers.py)."""
import math

import torch

from quiz_checks import accepts, flops


def test_09_favor_rms_error():
    # the relative RMS error of the m-feature estimate, measured: one feature's relative
    # variance E[Y²]/E[Y]² − 1 by quadrature over ω·(q̃ + k̃) ~ N(0, u), then divided by m
    from attnlab.linear import favor_feature
    d, u, m = 4, 3.0, 256
    q = torch.zeros(d, dtype=torch.float64)
    q[0] = math.sqrt(u) / 2 * d ** 0.25                       # q = k: ‖q̃ + k̃‖² = u
    s = torch.linspace(-12, 12, 20001, dtype=torch.float64)   # ω's component along q̃ + k̃
    omega = torch.zeros(s.numel(), d, dtype=torch.float64)
    omega[:, 0] = s
    density = torch.exp(-s ** 2 / 2) / math.sqrt(2 * math.pi) * (s[1] - s[0])
    y = favor_feature(q, omega) ** 2 * s.numel()              # one feature's estimate per ω
    mean, second = (y * density).sum(), (y ** 2 * density).sum()
    accepts("09-favor-rms-error", math.sqrt((second / mean ** 2 - 1).item() / m))


def test_09_chunked_flop_ratio():
    from attnlab.linear import linear_attention
    n, C, m = 256, 256, 64
    q, k, v = (torch.zeros(1, 1, n, m, device="meta") for _ in range(3))
    chunked = flops(lambda: linear_attention(q, k, v, causal=True, method="chunked", chunk=C))
    reads = flops(lambda: linear_attention(q, k, v, causal=True, method="recurrent"))
    accepts("09-chunked-flop-ratio", chunked / (2 * reads))   # + the elementwise writes


def test_09_kv_cache_outgrows_state():
    from attnlab.hybrid import CausalLinearAttention
    from attnlab.kv_cache import kv_cache_bytes
    d = 128
    state = CausalLinearAttention(d, 1).state_size()
    first = next(t for t in range(1, 10 * d) if kv_cache_bytes(1, 1, d, t, bytes_per_element=1) >= state)
    accepts("09-kv-cache-outgrows-state", first)


def test_09_chunked_softmax_flop_crossover():
    from attnlab.attention import scaled_dot_product_attention
    from attnlab.linear import linear_attention
    d, C = 96, 32

    def counts(n):
        q, k, v = (torch.zeros(1, 1, n, d, device="meta") for _ in range(3))
        softmax = flops(lambda: scaled_dot_product_attention(q, k, v, causal=True))
        chunked = flops(lambda: linear_attention(q, k, v, causal=True, method="chunked", chunk=C))
        return softmax, chunked

    first = next(n for n in range(C, 8 * C + 1, C) if counts(n)[1] <= counts(n)[0])
    accepts("09-chunked-softmax-flop-crossover", first)


def test_09_decay_weight_kept():
    from attnlab.linear import gated_linear_attention
    n = 201
    q = k = torch.ones(1, 1, n, 1, dtype=torch.float64)
    v = torch.zeros(1, 1, n, 1, dtype=torch.float64)
    v[..., 0, :] = 1.0                                              # only token 0 writes
    out = gated_linear_attention(q, k, v, torch.full_like(k, math.log(0.99)))
    accepts("09-decay-weight-kept", out[0, 0, -1, 0].item())


def test_09_one_level_chunk_overflow():
    from attnlab.linear import gated_linear_attention
    log_decay = torch.full((1, 1, 200, 1), -1.0)                    # float32
    b = log_decay.cumsum(-2)                                        # what the chunk form sums
    finite = torch.isfinite((-b).exp())[0, 0, :, 0]
    longest = int(finite.long().cumprod(0).sum())                   # chunk lengths with no overflow
    accepts("09-one-level-chunk-overflow", longest)
    # and the library's hardware-efficient form, which never forms e^{−b}, survives a longer chunk
    q = k = v = torch.ones(1, 1, 2 * longest, 1)
    out = gated_linear_attention(q, k, v, torch.full_like(k, -1.0), method="chunked_matmul",
                                 chunk=2 * longest, sub_chunk=16)
    assert torch.isfinite(out).all()
    assert math.isclose(out[0, 0, -1, 0].item(), 1 / (1 - math.exp(-1)), rel_tol=1e-5)
