"""FlashAttention (tiled, recomputing backward) against the reference form and torch's SDPA."""
import math
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

from attnlab.attention import causal_mask, scaled_dot_product_attention
from attnlab.flash import (fa1_block_sizes, fa2_block_sizes, flash_attention, flash_forward, flash_trace,
                           hbm_accesses_flash, hbm_accesses_flash2, hbm_accesses_standard, online_softmax)
from attnlab.numerics import agrees, error_ratio


def _qkv(b, h, h_kv, n, m, d, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, n, d, generator=g, dtype=dtype), torch.randn(b, h_kv, m, d, generator=g, dtype=dtype),
            torch.randn(b, h_kv, m, d, generator=g, dtype=dtype))


@given(st.integers(1, 70), st.integers(1, 70), st.sampled_from([(2, 2), (4, 1), (4, 2)]), st.sampled_from([1, 8, 16]),
       st.sampled_from([4, 7, 16, 64]), st.sampled_from([3, 16, 256]), st.booleans(), st.integers(0, 999))
def test_forward_agrees_with_torch(n, m, heads, d, block_q, block_k, causal, seed):
    h, h_kv = heads
    if causal:
        n = min(n, m)
    q, k, v = _qkv(1, h, h_kv, n, m, d, seed)
    ours = flash_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
    exact = scaled_dot_product_attention(q.double(), k.double(), v.double(), causal=causal)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(n, m) if causal else None,
                                            enable_gqa=h != h_kv)
    scale = v.abs().max().item()
    assert agrees(ours, theirs, exact, scale=scale), error_ratio(ours, theirs, exact, scale=scale)


@given(st.integers(1, 40), st.integers(1, 40), st.booleans(), st.sampled_from([5, 16]), st.integers(0, 999))
def test_gradients_equal_autograd_through_the_reference(n, m, causal, block, seed):
    q, k, v = (t.requires_grad_() for t in _qkv(1, 4, 2, n, m, 8, seed, torch.float64))
    g = torch.randn(1, 4, n, 8, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    ours = torch.autograd.grad((flash_attention(q, k, v, causal=causal, block_q=block, block_k=block) * g).sum(), (q, k, v))
    ref = torch.autograd.grad((scaled_dot_product_attention(q, k, v, causal=causal) * g).sum(), (q, k, v))
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, atol=1e-10), (a - b).abs().max()


def test_gradcheck():
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 1, 5, 7, 4, 0, torch.float64))
    assert torch.autograd.gradcheck(lambda q, k, v: flash_attention(q, k, v, causal=True, block_q=2, block_k=3), (q, k, v))


def test_empty_rows_give_zeros_and_finite_gradients():
    q, k, v = (t.requires_grad_() for t in _qkv(1, 1, 1, 6, 3, 4, 1, torch.float64))
    out = flash_attention(q, k, v, causal=True, block_q=2, block_k=2)        # queries 0-2 precede every key
    assert torch.equal(out[0, 0, :3], torch.zeros(3, 4, dtype=torch.float64))
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)


def test_online_softmax_equals_softmax():
    x = torch.randn(3, 5, 37, dtype=torch.float64)
    probs, row_max, normaliser = online_softmax(x, block=8)
    assert torch.allclose(probs, torch.softmax(x, -1))
    assert torch.allclose(row_max, x.amax(-1))
    assert torch.allclose(normaliser, torch.exp(x - x.amax(-1, keepdim=True)).sum(-1))


def test_bad_input():
    q, k, v = _qkv(1, 2, 2, 4, 4, 8, 0)
    with pytest.raises(ValueError, match=r"\(b, h, n, d\)"):
        flash_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="flash_attention: block_q must be a positive int, got -1"):
        flash_attention(q, k, v, block_q=-1)
    with pytest.raises(ValueError, match="k must have the same head dimension"):
        flash_attention(q, k[..., :4], v)


def test_io_model_standard_is_algorithm_0():
    n, d = 4096, 64
    assert hbm_accesses_standard(n, d) == 4 * n * d + 4 * n * n


@pytest.mark.parametrize("sram,d", [(98_304, 64), (98_304, 128), (16_384, 128), (1024, 16), (100, 64)])
def test_fa1_block_sizes_follow_algorithm_1_line_1(sram, d):
    block_r, block_c = fa1_block_sizes(sram, d)
    assert block_c == math.ceil(sram / (4 * d)) and block_r == min(block_c, d)


def test_io_model_fa1_counts_algorithm_1_line_by_line():
    """2nd for K, V; nd + 2n to initialise O, l, m; then 3nd + 4n per outer pass over K/V blocks."""
    n, d, sram = 1000, 64, 98_304
    _, block_c = fa1_block_sizes(sram, d)
    passes = math.ceil(n / block_c)
    assert hbm_accesses_flash(n, d, sram) == 2 * n * d + (n * d + 2 * n) + passes * (3 * n * d + 4 * n)
    # Θ(n² d² / M): 4× the SRAM, about 1/4 of the traffic; 2× the length, about 4× the traffic
    small, big = hbm_accesses_flash(8192, d, 2**15), hbm_accesses_flash(8192, d, 2**17)
    assert small / big == pytest.approx(4, rel=0.05)
    assert hbm_accesses_flash(2 * 8192, d, 2**16) / hbm_accesses_flash(8192, d, 2**16) == pytest.approx(4, rel=0.05)
    # against standard attention the ratio tends to M / 3d² for long sequences
    ratio = hbm_accesses_standard(2**17, d) / hbm_accesses_flash(2**17, d, sram)
    assert ratio == pytest.approx(sram / (3 * d * d), rel=0.1)


def test_io_model_fa2_rereads_kv_once_per_query_block():
    n, d, sram = 4096, 64, 98_304
    block_r, block_c = fa2_block_sizes(sram, d)
    assert block_r == block_c and block_r ** 2 + 4 * block_r * d <= sram < (block_r + 1) ** 2 + 4 * (block_r + 1) * d
    assert hbm_accesses_flash2(n, d, sram) == 2 * n * d + n + math.ceil(n / block_r) * 2 * n * d
    assert fa2_block_sizes(10, 64) == (1, 1)                       # nothing fits: one row at a time
    # FlashAttention-2's own B_r: the forward's intensity, 4n²d FLOPs over 2 bytes per element,
    # is about B_r FLOPs per byte (§7.6)
    for b_r in (64, 128):
        assert hbm_accesses_flash2(n, d, sram, block_r=b_r) == 2 * n * d + n + math.ceil(n / b_r) * 2 * n * d
        intensity = 4 * 8192 ** 2 * 64 / (2 * hbm_accesses_flash2(8192, 64, 98_304, block_r=b_r))
        assert 0.98 * b_r < intensity < b_r


def test_io_advantage_collapses_as_d_grows():
    """The ratio standard / FA-1 falls like 1/d²; past d ≈ sqrt(M/3) tiling moves more than it saves."""
    n, sram = 8192, 98_304
    ratios = [hbm_accesses_standard(n, d) / hbm_accesses_flash(n, d, sram) for d in (32, 64, 128, 256)]
    assert ratios == sorted(ratios, reverse=True) and ratios[1] > 6 and ratios[-1] < 1


def test_trace_holds_the_current_tile_only():
    q, k, v = _qkv(1, 1, 1, 8, 8, 4, 5, torch.float64)
    _, trace = flash_trace(q, k, v, causal=False, block_q=4, block_k=4)
    for snap in trace:
        q0, q1, k0, k1 = snap["tile"]
        s = q[0, 0, q0:q1] @ k[0, 0, k0:k1].T / 2
        expected = torch.exp(s - snap["row_max"][0, 0, q0:q1, None])
        assert snap["p"].shape == (1, 1, q1 - q0, k1 - k0) and torch.allclose(snap["p"][0, 0], expected)
        assert snap["p"].max() <= 1


def test_trace_ends_at_the_output_and_skips_masked_tiles():
    q, k, v = _qkv(1, 1, 1, 8, 8, 4, 3, torch.float64)
    out, trace = flash_trace(q, k, v, causal=True, block_q=4, block_k=4)
    assert [t["tile"] for t in trace] == [(0, 4, 0, 4), (4, 8, 0, 4), (4, 8, 4, 8)]   # tile (0-4, 4-8) is skipped
    assert torch.allclose(trace[-1]["out"], out)
    assert torch.allclose(out, scaled_dot_product_attention(q, k, v, causal=True))


@pytest.mark.parametrize("causal", [False, True])
def test_flash_forward_returns_the_log_sum_exp(causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64) for n in (37, 53, 53))
    out, lse = flash_forward(q, k, v, causal=causal, block_q=16, block_k=16)
    scores = q @ k.transpose(-2, -1) / math.sqrt(8)
    if causal:
        scores = scores.masked_fill(~torch.ones(37, 53, dtype=torch.bool).tril(53 - 37), float("-inf"))
    assert torch.allclose(lse, torch.logsumexp(scores, -1), atol=1e-12)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=False, attn_mask=scores > float("-inf")),
                          atol=1e-12)
