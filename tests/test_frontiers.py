"""Chapter 14's library: every alternative form equals its reference (ring, MLA, speculative
sampling, NSA branches), quantisation errors fall with K smoothing, MoD routes exactly k tokens."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

from attnlab.attention import causal_mask, scaled_dot_product_attention
from attnlab.mla import MultiHeadLatentAttention
from attnlab.mod import MixtureOfDepths, block_flops_fraction, routed_tokens, top_k_route
from attnlab.models import GPTConfig, MicroGPT
from attnlab.nsa import compress, keys_attended, native_sparse_attention, selection_mask
from attnlab.numerics import agrees, error_ratio, max_abs_error
from attnlab.quant import fake_fp4, quantize_int8, quantized_attention, smooth_keys
from attnlab.ring import merge_partials, ring_attention, ring_costs, ring_schedule
from attnlab.sparse import sliding_window_mask
from attnlab.speculative import (
    acceptance_rate, autoregressive_distribution, expected_speedup, expected_tokens_per_step, next_token_probs,
    output_distribution, residual_distribution, speculative_generate, step_distribution, verify,
)


def qkv(b, h, n, d, seed, h_kv=None, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, n, d, generator=g, dtype=dtype), torch.randn(b, h_kv or h, n, d, generator=g, dtype=dtype),
            torch.randn(b, h_kv or h, n, d, generator=g, dtype=dtype))


# ---- ring attention -------------------------------------------------------------------------

@given(st.integers(1, 70), st.integers(1, 9), st.booleans(), st.integers(1, 9), st.integers(0, 999))
def test_ring_attention_equals_exact_attention(n, devices, causal, block, seed):
    q, k, v = qkv(2, 2, n, 8, seed)
    ours = ring_attention(q, k, v, devices, causal=causal, block=block)
    mask = causal_mask(n) if causal else None
    exact = scaled_dot_product_attention(q.double(), k.double(), v.double(), causal=causal)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert agrees(ours, theirs, exact, scale=v.abs().max().item()), error_ratio(ours, theirs, exact)


def test_ring_attention_gqa_and_large_n():
    q, k, v = qkv(1, 4, 1000, 16, 1, h_kv=2)
    for causal in (False, True):
        ours = ring_attention(q, k, v, 7, causal=causal)
        exact = scaled_dot_product_attention(q.double(), k.double(), v.double(), causal=causal)
        theirs = scaled_dot_product_attention(q, k, v, causal=causal)
        assert agrees(ours, theirs, exact, scale=v.abs().max().item())


def test_merge_of_two_halves_is_the_whole():
    q, k, v = qkv(1, 1, 10, 4, 3, dtype=torch.float64)
    parts = []
    for sl in (slice(0, 4), slice(4, 10)):
        s = q @ k[..., sl, :].transpose(-2, -1) / 2
        parts += [torch.softmax(s, -1) @ v[..., sl, :], torch.logsumexp(s, -1)]
    merged, lse = merge_partials(*parts)
    assert torch.allclose(merged, scaled_dot_product_attention(q, k, v))
    assert torch.allclose(lse, torch.logsumexp(q @ k.transpose(-2, -1) / 2, -1))
    for mark in (float("-inf"), float("inf")):                  # log 0 = saw no key (+inf accepted)
        empty = torch.full((1, 1, 10), mark, dtype=torch.float64)
        same, same_lse = merge_partials(torch.zeros_like(merged), empty, merged, lse)
        assert torch.equal(same, merged) and torch.equal(same_lse, lse)
        both, both_lse = merge_partials(torch.zeros_like(merged), empty, torch.zeros_like(merged), empty)
        assert torch.equal(both, torch.zeros_like(merged)) and torch.isneginf(both_lse).all()


def test_ring_schedule_and_costs():
    schedule = ring_schedule(4)
    assert schedule[0] == [0, 1, 2, 3] and schedule[1] == [3, 0, 1, 2]
    assert all(sorted(col) == [0, 1, 2, 3] for col in zip(*schedule))          # every device sees every block once
    one, eight = ring_costs(1 << 20, 128, 1), ring_costs(1 << 20, 128, 8)
    assert eight["memory per device"] * 8 == one["memory per device"]
    assert one["sent per device"] == 0 and eight["sent per device"] == 7 * 2 * (1 << 17) * 128 * 2
    with pytest.raises(ValueError, match="n_devices"):
        ring_attention(*qkv(1, 1, 4, 2, 0), 0)


# ---- multi-head latent attention ------------------------------------------------------------

@given(st.integers(1, 20), st.integers(1, 4), st.sampled_from([2, 4, 8]), st.integers(0, 99))
def test_mla_absorbed_equals_explicit(length, heads, d_rope, seed):
    torch.manual_seed(seed)
    layer = MultiHeadLatentAttention(d_model=24, n_heads=heads, d_head=8, d_latent=12, d_rope=d_rope)
    x = torch.randn(2, length, 24)
    exact = layer.double()(x.double())
    explicit = layer.float()(x)
    absorbed = layer(x, absorbed=True)
    assert agrees(absorbed, explicit, exact), error_ratio(absorbed, explicit, exact)


def test_mla_is_causal_and_caches_the_latent():
    torch.manual_seed(0)
    layer = MultiHeadLatentAttention(32, 4, 8, 16, 4).double()
    x = torch.randn(1, 12, 32, dtype=torch.float64)
    y = x.clone()
    y[:, 7:] += 1
    assert torch.allclose(layer(x)[:, :7], layer(y)[:, :7])
    c, k_rope = layer.latent_cache(x)
    assert c.shape == (1, 12, 16) and k_rope.shape == (1, 1, 12, 4)
    with pytest.raises(ValueError, match="d_rope must be even"):
        MultiHeadLatentAttention(32, 4, 8, 16, 3)


@given(st.integers(1, 9), st.integers(1, 3), st.sampled_from([2, 4]), st.integers(0, 99))
def test_mla_decodes_token_by_token_from_the_latent_cache(length, heads, d_rope, seed):
    """Decoding caches only (c_t, k^R_t) and runs the absorbed form for the newest query."""
    from attnlab.positional import apply_rope

    torch.manual_seed(seed)
    layer = MultiHeadLatentAttention(24, heads, 8, 12, d_rope).double()
    x = torch.randn(2, length, 24, dtype=torch.float64)
    c_all, k_rope_all = layer.latent_cache(x)
    cache_c, cache_r, rows = [], [], []
    for t in range(length):
        x_t, pos = x[:, t:t + 1], torch.tensor([t])
        cache_c.append(layer.w_dkv(x_t))
        cache_r.append(apply_rope(layer.w_kr(x_t), pos))
        C, K_R = torch.cat(cache_c, 1).unsqueeze(1), torch.cat(cache_r, 1).unsqueeze(1)
        q = layer.w_q(x_t).view(2, heads, 1, 8)
        q_r = apply_rope(layer.w_qr(x_t).view(2, heads, 1, d_rope), pos)
        s = torch.einsum("bhld,hcd->bhlc", q, layer.w_uk) @ C.mT + q_r @ K_R.mT
        o = torch.einsum("bhlc,hcd->bhld", torch.softmax(s / math.sqrt(8 + d_rope), -1) @ C, layer.w_uv)
        rows.append(layer.w_o(o.reshape(2, 1, heads * 8)))
    assert torch.allclose(C[:, 0], c_all, rtol=0, atol=1e-12)              # the cache is the latent
    assert torch.allclose(K_R, k_rope_all, rtol=0, atol=1e-12)
    full = layer(x)
    for t in range(length):
        assert torch.allclose(rows[t][:, 0], full[:, t], rtol=0, atol=1e-10), t


# ---- speculative decoding -------------------------------------------------------------------

def test_expected_tokens_and_speedup():
    assert expected_tokens_per_step(0.0, 4) == 1 and expected_tokens_per_step(1.0, 4) == 5
    assert expected_tokens_per_step(0.8, 4) == pytest.approx(sum(0.8 ** i for i in range(5)))
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 1.2))
    assert expected_speedup(0.8, 4, 0.05) > 2                                      # the source's formula never exceeds 1


def tiny_pair(vocab=4, seed=0):
    torch.manual_seed(seed)
    target = MicroGPT(GPTConfig(vocab_size=vocab, max_len=16, n_layers=2, d_model=16, n_heads=2))
    draft = MicroGPT(GPTConfig(vocab_size=vocab, max_len=16, n_layers=1, d_model=8, n_heads=1))
    for model in (target, draft):                     # sharpen the initial near-uniform distributions
        model.lm_head.weight.data.mul_(40)
    return target.eval(), draft.eval()


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_speculative_output_distribution_is_the_targets(gamma):
    target, draft = tiny_pair()
    p, q = next_token_probs(target), next_token_probs(draft)
    prefix, vocab = (1, 3), 4
    assert acceptance_rate(p(prefix), q(prefix)) < 0.95                    # the draft really differs
    spec = output_distribution(p, q, prefix, gamma, 3, vocab)
    plain = autoregressive_distribution(p, prefix, 3, vocab)
    assert spec.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert max_abs_error(spec, plain) < 1e-12


def test_step_distribution_of_one_token_is_p():
    p_vec = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    q_vec = torch.tensor([0.1, 0.1, 0.2, 0.6], dtype=torch.float64)
    step = step_distribution(lambda s: p_vec, lambda s: q_vec, (), 1)
    first = torch.zeros(4, dtype=torch.float64)
    for tokens, prob in step.items():
        first[tokens[0]] += prob
    assert torch.allclose(first, p_vec)
    assert torch.allclose(residual_distribution(p_vec, q_vec), torch.tensor([0.4, 0.2, 0.0, 0.0], dtype=torch.float64) / 0.6)
    assert torch.equal(residual_distribution(p_vec, p_vec), p_vec)


def test_verify_samples_match_the_exact_distribution():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.2, 0.6]], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(3, dtype=torch.float64)
    trials = 20000
    for _ in range(trials):
        draft = int(torch.multinomial(q[0], 1, generator=g))
        counts[verify(p, q, [draft], g)[0]] += 1
    assert max_abs_error(counts / trials, p[0]) < 4 * math.sqrt(0.25 / trials)   # 4 standard errors


def test_speculative_generate_samples_the_tempered_targets_distribution():
    """Statistical check of ``speculative_generate`` itself (its slicing, temperature and shortened
    last step): the empirical law of 2 new tokens (γ = 3, so the second step drafts fewer than γ)
    against the exact autoregressive law of the target at the same temperature."""
    target, draft = tiny_pair(vocab=3, seed=3)
    prefix, temperature, trials = (1, 2), 3.0, 2000
    p = next_token_probs(target, temperature=temperature)
    q = next_token_probs(draft, temperature=temperature)
    assert acceptance_rate(p(prefix), q(prefix)) < 0.95                        # the draft really differs
    exact = autoregressive_distribution(p, prefix, 2, 3).flatten()
    counts = torch.zeros(9, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    for _ in range(trials):
        ids, _ = speculative_generate(target, draft, torch.tensor([prefix]), 2, gamma=3,
                                      temperature=temperature, generator=g)
        counts[3 * ids[0, 2] + ids[0, 3]] += 1
    # each cell within 4.5 standard errors of its exact probability
    bound = 4.5 * torch.sqrt(exact * (1 - exact) / trials) + 1e-12
    assert ((counts / trials - exact).abs() <= bound).all(), (counts / trials, exact)


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_cached_speculative_generate_writes_the_same_tokens_as_uncached(gamma):
    """use_cache=True feeds only what each cache lacks and rolls both back after every verify pass;
    in float64 its logits equal the uncached ones to rounding, so the same seed gives the same run."""
    target, draft = (m.double() for m in tiny_pair(vocab=6, seed=4))
    for model in (target, draft):
        model.lm_head.weight.data.div_(8)                       # accept some drafts, reject others
    accepted = rejected = 0
    for seed in range(4):
        runs = [speculative_generate(target, draft, torch.tensor([[0, 1, 2]]), 11, gamma=gamma,
                                     use_cache=cached, generator=torch.Generator().manual_seed(seed))
                for cached in (False, True)]
        assert torch.equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]
        accepted, rejected = accepted + runs[1][1]["accepted"], rejected + runs[1][1]["rejected"]
    assert accepted > 0 and rejected > 0                        # both paths of the rollback ran


def test_speculative_generate_with_micro_gpts():
    target, draft = tiny_pair(vocab=6, seed=1)
    ids, stats = speculative_generate(target, draft, torch.tensor([[0, 1]]), 12, gamma=3,
                                      generator=torch.Generator().manual_seed(0))
    assert ids.shape == (1, 14) and 0 <= stats["acceptance"] <= 1
    assert stats["drafted"] <= 3 * stats["steps"] and stats["steps"] <= 12
    assert stats["accepted"] + stats["steps"] == 12                              # each step adds one non-draft token
    same, perfect = speculative_generate(target, target, torch.tensor([[0, 1]]), 12, gamma=3,
                                         generator=torch.Generator().manual_seed(0))
    assert same.shape == (1, 14) and same[0, :2].tolist() == [0, 1] and 0 <= same.min() <= same.max() < 6
    # a draft equal to the target is always accepted: every pass emits γ + 1 = 4 tokens
    assert perfect == {"steps": 3, "drafted": 9, "accepted": 9, "rejected": 0, "acceptance": 1.0}


@pytest.mark.parametrize("new_tokens, gamma", [(12, 3), (13, 3), (5, 4), (1, 2), (7, 1)])
def test_a_perfect_draft_needs_ceil_n_over_gamma_plus_one_target_passes(new_tokens, gamma):
    """Each step emits min(γ + 1, remaining) tokens when nothing is rejected (the last step drafts
    only remaining − 1 tokens), so the target runs ⌈N / (γ + 1)⌉ times."""
    target, _ = tiny_pair(vocab=6, seed=2)
    ids, stats = speculative_generate(target, target, torch.tensor([[3]]), new_tokens, gamma=gamma,
                                      generator=torch.Generator().manual_seed(1))
    assert ids.shape == (1, 1 + new_tokens)
    assert stats["steps"] == math.ceil(new_tokens / (gamma + 1)) and stats["rejected"] == 0
    assert stats["accepted"] == stats["drafted"] == new_tokens - stats["steps"]


def test_verify_and_speculative_generate_validate():
    p, q = torch.full((3, 4), 0.25, dtype=torch.float64), torch.full((2, 4), 0.25, dtype=torch.float64)
    assert len(verify(p, q, [0, 1], torch.Generator().manual_seed(0))) in (1, 2, 3)
    with pytest.raises(ValueError, match=r"p must be \(3, V\)"):
        verify(p[:2], q, [0, 1])                                        # p needs one row more than drafts
    with pytest.raises(ValueError, match=r"q \(2, V\)"):
        verify(p, q[:1], [0, 1])
    target, draft = tiny_pair(vocab=4, seed=0)
    with pytest.raises(ValueError, match="prompt must have shape"):
        speculative_generate(target, draft, torch.tensor([0, 1]), 4)        # 1-D prompt
    with pytest.raises(ValueError, match="prompt must have shape"):
        speculative_generate(target, draft, torch.tensor([[0], [1]]), 4)    # batch of 2
    with pytest.raises(ValueError, match="gamma must be >= 1"):
        speculative_generate(target, draft, torch.tensor([[0, 1]]), 4, gamma=0)
    with pytest.raises(ValueError, match="new_cache"):
        speculative_generate(lambda ids: target(ids), draft, torch.tensor([[0, 1]]), 4, use_cache=True)


# ---- native sparse attention ----------------------------------------------------------------

def test_nsa_shapes_and_branch_limits():
    q, k, v = qkv(2, 4, 45, 8, 0, h_kv=2, dtype=torch.float64)
    gates = torch.rand(2, 4, 45, 3, dtype=torch.float64)
    out, branches = native_sparse_attention(q, k, v, gates, block=8, n_selected=2, window=5, return_branches=True)
    assert out.shape == (2, 4, 45, 8)
    assert all(branches[name].shape == (2, 4, 45, 8) for name in ("compressed", "selected", "window"))
    selected = branches["selection_mask"]
    assert selected.shape == (2, 2, 45, 45) and not selected.triu(1).any()            # causal
    blocks_used = F.pad(selected, (0, 3)).unflatten(-1, (6, 8)).any(-1).sum(-1)
    assert blocks_used.max() <= 2 and selected.diagonal(dim1=-2, dim2=-1).all()        # own block always in
    assert torch.allclose(out, gates[..., :1] * branches["compressed"] + gates[..., 1:2] * branches["selected"]
                          + gates[..., 2:] * branches["window"])
    assert compress(k, 8).shape == (2, 2, 5, 8)
    assert keys_attended(65536, block=64, n_selected=16, window=512)["selected"] == 1024


def test_nsa_key_count_reproduces_the_papers_table_4():
    """Yuan et al. 2025, Table 4: 5,632 keys per decoding step at 64K (compression l = 32, stride 16)."""
    counts = keys_attended(65536, block=64, n_selected=16, window=512, compress_block=32, compress_stride=16)
    assert counts["compressed"] == 4095 and sum(counts[k] for k in ("compressed", "selected", "window")) == 5632
    assert keys_attended(100, block=64, n_selected=1, window=4)["compressed"] == 1
    assert keys_attended(10, block=16, n_selected=1, window=4)["compressed"] == 0


def test_nsa_is_causal():
    q, k, v = qkv(1, 2, 40, 8, 1, dtype=torch.float64)
    gates = torch.rand(1, 2, 40, 3, dtype=torch.float64)
    base = native_sparse_attention(q, k, v, gates, block=4, n_selected=3, window=6)
    k2, v2, q2 = k.clone(), v.clone(), q.clone()
    k2[..., 25:, :] += 3
    v2[..., 25:, :] -= 2
    q2[..., 25:, :] *= -1
    moved = native_sparse_attention(q2, k2, v2, gates, block=4, n_selected=3, window=6)
    assert torch.equal(moved[..., :25, :], base[..., :25, :])


def test_nsa_branches_reduce_to_known_attention():
    q, k, v = qkv(1, 2, 37, 8, 2, dtype=torch.float64)
    gates = torch.rand(1, 2, 37, 3, dtype=torch.float64)
    full = scaled_dot_product_attention(q, k, v, causal=True)
    _, every = native_sparse_attention(q, k, v, gates, block=8, n_selected=5, window=3, return_branches=True)
    assert torch.allclose(every["selected"], full)                           # all blocks selected = full causal
    window = scaled_dot_product_attention(q, k, v, sliding_window_mask(37, 3, causal=True))
    assert torch.allclose(every["window"], window)
    k_cmp, v_cmp = compress(k, 8), compress(v, 8)                             # query 20 sees blocks 0 and 1
    ref = scaled_dot_product_attention(q[..., 20:21, :], k_cmp[..., :2, :], v_cmp[..., :2, :])
    assert torch.allclose(every["compressed"][..., 20:21, :], ref)
    assert every["compressed"][..., :7, :].abs().max() == 0                    # no complete block yet: zeros


def _nsa_reference(q, k, v, gates, l, n_sel, w):
    """NSA from Yuan et al. 2025 section 3, one query at a time (the library's simplifications:
    mean-pooled blocks of l, the query's own block always selected, one K/V for all branches)."""
    b, h, n, d = q.shape
    group = h // k.shape[1]
    out = torch.zeros_like(q)

    def attend(qv, keys, values):
        if len(keys) == 0:
            return torch.zeros(d, dtype=q.dtype), torch.zeros(0, dtype=q.dtype)
        p = torch.softmax(torch.stack([qv @ key for key in keys]) / math.sqrt(d), 0)
        return sum(p_ * val for p_, val in zip(p, values)), p

    for bi in range(b):
        for g in range(k.shape[1]):
            heads = range(g * group, (g + 1) * group)
            K, V = k[bi, g], v[bi, g]
            for i in range(n):
                done = [j for j in range((i + 1) // l)]                 # blocks ending at or before i
                K_cmp = [K[j * l:(j + 1) * l].mean(0) for j in done]
                V_cmp = [V[j * l:(j + 1) * l].mean(0) for j in done]
                o_cmp, importance = {}, torch.zeros(len(done), dtype=q.dtype)
                for hi in heads:
                    o_cmp[hi], p = attend(q[bi, hi, i], K_cmp, V_cmp)
                    importance = importance + p                         # shared by the GQA group
                own = i // l
                earlier = sorted(range(own), key=lambda j: -float(importance[j]))[:n_sel - 1]
                picked = [t for t in range(i + 1) if t // l in set(earlier) | {own}]
                window = range(max(0, i - w), i + 1)
                for hi in heads:
                    o_slc, _ = attend(q[bi, hi, i], K[picked], V[picked])
                    o_win, _ = attend(q[bi, hi, i], K[list(window)], V[list(window)])
                    g_c, g_s, g_w = gates[bi, hi, i]
                    out[bi, hi, i] = g_c * o_cmp[hi] + g_s * o_slc + g_w * o_win
    return out


@given(st.data())
def test_nsa_equals_a_per_query_reference(data):
    l = data.draw(st.integers(1, 6), label="l")
    n = data.draw(st.integers(l + 1, 30), label="n")                  # at least two blocks
    n_blocks = math.ceil(n / l)
    n_sel = data.draw(st.integers(1, n_blocks - 1), label="n_selected")   # fewer than all blocks
    h_kv, group = data.draw(st.integers(1, 2), label="h_kv"), data.draw(st.integers(1, 3), label="group")
    w = data.draw(st.integers(0, 6), label="window")
    seed = data.draw(st.integers(0, 99), label="seed")
    q, k, v = qkv(1, h_kv * group, n, 4, seed, h_kv=h_kv, dtype=torch.float64)
    gates = torch.rand(1, h_kv * group, n, 3, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)
    ours = _nsa_reference(q, k, v, gates, l, n_sel, w)
    theirs = native_sparse_attention(q, k, v, gates, block=l, n_selected=n_sel, window=w)
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-12)


def test_selection_follows_importance():
    importance = torch.tensor([[[[0.1, 0.7, 0.2, 0.0]]]]).expand(1, 1, 32, 4)
    mask = selection_mask(importance, 32, 8, 2)
    assert mask[0, 0, 31].view(4, 8).any(-1).tolist() == [False, True, False, True]   # block 1 and its own block 3
    with pytest.raises(ValueError, match="gates must have shape"):
        native_sparse_attention(*qkv(1, 2, 8, 4, 0), torch.rand(1, 2, 8, 2))


# ---- quantised attention --------------------------------------------------------------------

def test_int8_quantisation_round_trip():
    x = torch.randn(3, 37, 16)
    ints, scale = quantize_int8(x, 8)
    assert ints.dtype == torch.int8 and scale.shape == (3, 37, 1)
    assert torch.all((ints * scale - x).abs() <= scale / 2 + 1e-6)
    assert torch.equal(scale[:, :8], scale[:, :1].expand(-1, 8, -1))           # one scale per block of 8 tokens
    y = torch.randn(4, 32)
    assert (fake_fp4(y) - y).abs().max() <= y.abs().max() / 6                  # half the widest E2M1 gap, 2 of 6


def test_smoothing_is_exact_without_quantisation():
    q, k, v = qkv(1, 2, 50, 16, 0)
    k = k + 5
    exact = scaled_dot_product_attention(q.double(), k.double(), v.double())
    ours = scaled_dot_product_attention(q, smooth_keys(k), v)
    assert agrees(ours, scaled_dot_product_attention(q, k, v), exact, scale=v.abs().max().item())


@pytest.mark.parametrize("fmt", ["int8", "fp4"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_smoothing_reduces_quantisation_error_with_a_large_key_mean(fmt, seed):
    q, k, v = qkv(1, 4, 128, 64, seed)
    g = torch.Generator().manual_seed(seed + 10)
    k = k + 6 * torch.randn(1, 4, 1, 64, generator=g)                          # a shared offset, as in trained keys
    exact = scaled_dot_product_attention(q.double(), k.double(), v.double())
    plain = max_abs_error(quantized_attention(q, k, v, smooth_k=False, fmt=fmt), exact)
    smooth = max_abs_error(quantized_attention(q, k, v, smooth_k=True, fmt=fmt), exact)
    assert smooth < plain / 2, (plain, smooth)


def test_quantized_attention_validates():
    q, k, v = qkv(1, 2, 8, 16, 0)
    with pytest.raises(ValueError, match="fmt must be"):
        quantized_attention(q, k, v, fmt="int4")
    with pytest.raises(ValueError, match="divisible by group"):
        fake_fp4(torch.randn(3, 10))


# ---- mixture of depths ----------------------------------------------------------------------

@given(st.integers(1, 30), st.floats(0.01, 1.0), st.integers(0, 99))
def test_mod_routes_exactly_capacity_tokens(length, capacity, seed):
    torch.manual_seed(seed)
    layer = MixtureOfDepths(16, 2, capacity)
    x = torch.randn(3, length, 16)
    out, routes = layer(x, return_routes=True)
    k = math.ceil(capacity * length)
    assert routes.shape == (3, k) and torch.all(routes[:, 1:] > routes[:, :-1])
    skipped = torch.ones(3, length, dtype=torch.bool).scatter(1, routes, False)
    assert torch.equal(out[skipped], x[skipped])                               # skipped tokens ride the residual


def test_mod_routes_the_top_scores_and_trains_the_router():
    scores = torch.tensor([[0.1, 0.9, -1.0, 0.5, 0.3]])
    assert top_k_route(scores, 2).tolist() == [[1, 3]]
    torch.manual_seed(0)
    layer = MixtureOfDepths(16, 2, 0.5)
    x = torch.randn(2, 10, 16)
    layer(x).pow(2).sum().backward()
    assert layer.router.weight.grad.abs().sum() > 0
    full = MixtureOfDepths(16, 2, 1.0)
    out = full(x)
    r = full.router(x)
    assert torch.allclose(out, x + r * (full.block(x, causal=True) - x), atol=1e-6)   # capacity 1: every token
    assert routed_tokens(0.125, 100) == 13
    assert block_flops_fraction(1.0, 64, 32) == 1 and block_flops_fraction(0.5, 64, 32) < 0.5
    with pytest.raises(ValueError, match="capacity must be"):
        MixtureOfDepths(16, 2, 0.0)


# ---- the lineage figure ---------------------------------------------------------------------

def test_lineage_graph_draws_nodes_and_forward_edges():
    from attnlab import viz

    nodes = [{"name": "A", "year": 2017, "family": "x"}, {"name": "B", "year": 2019, "family": "x"},
             {"name": "C", "year": 2019, "family": "y", "note": "paper"}]
    fig = viz.lineage_graph(nodes, [("A", "B"), ("A", "C")])
    arrows = [a for a in fig.layout.annotations if a.showarrow]
    assert len(fig.data) == 2 and len(arrows) == 2
    rows = [y for trace in fig.data for y in trace.y]
    assert len(set(rows)) == len(rows) == 3                              # one row per method
    assert sorted(fig.data[0].text) == ["A", "B"]
    with pytest.raises(ValueError, match="points back in time"):
        viz.lineage_graph(nodes, [("B", "A")])
    with pytest.raises(ValueError, match="not in nodes"):
        viz.lineage_graph(nodes, [("A", "Z")])


# ---- chapter 14's lineage: every method links a section that exists --------------------------

def _notebook_labels():
    import json
    import re
    from pathlib import Path

    labels = {}
    for path in sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                         if c["cell_type"] == "markdown")
        labels[path.stem[:2]] = (path.stem, set(re.findall(r"^\((ch\d\d-[\w-]+)\)=", text, re.M)))
    return labels


def test_lineage_links_sections_that_exist():
    import json
    import re
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / "14_frontiers.ipynb").read_text())
    (cell,) = ["".join(c["source"]) for c in nb["cells"]
               if c["cell_type"] == "code" and "viz.lineage_graph(nodes, edges)" in "".join(c["source"])]
    entries = re.findall(r'N\("([^"]+)",\s*(\d{4}),.*?"(ch\d\d-[\w-]+)"\)', cell, re.S)
    calls = len(re.findall(r"^\s+N\(", cell, re.M))
    assert len(entries) == calls >= 40, (len(entries), calls)       # every entry names a label
    labels = _notebook_labels()
    missing = [(name, where) for name, _, where in entries
               if where not in labels.get(where[2:4], ("", set()))[1]]
    assert not missing, f"lineage entries linking sections that do not exist: {missing}"
    # the table's stems are the real notebook names
    (table,) = ["".join(c["source"]) for c in nb["cells"]
                if c["cell_type"] == "code" and "STEMS = [" in "".join(c["source"])]
    stems = re.findall(r'"(\d\d_[a-z_0-9]+)"', table)
    assert stems == [labels[k][0] for k in sorted(labels)]


def test_chapter_14_prose_links_resolve():
    """Every cross-reference written in chapter 14's markdown names a label that exists: links to
    another chapter (notebooks/NN_stem.html#chNN-...), {ref} roles, and errata anchors."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    nb = json.loads((root / "notebooks" / "14_frontiers.ipynb").read_text())
    prose = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    labels = _notebook_labels()
    links = re.findall(r"notebooks/(\d\d_[a-z0-9_]+)\.html#([\w-]+)", prose)
    refs = re.findall(r"\{ref\}`[^`<]*<(ch\d\d-[\w-]+)>`", prose)
    errata = re.findall(r"errata\.html#([\w-]+)", prose)
    assert len(links) >= 4 and len(errata) >= 13, (links, errata)
    bad = [(stem, label) for stem, label in links
           if labels.get(stem[:2], ("", set()))[0] != stem or label not in labels[stem[:2]][1]]
    bad += [("{ref}", label) for label in refs if label not in labels.get(label[2:4], ("", set()))[1]]
    errata_labels = set(re.findall(r"^\((errata-[\w-]+)\)=", (root / "book" / "errata.md").read_text(), re.M))
    bad += [("errata", label) for label in errata if label not in errata_labels]
    assert not bad, f"chapter 14 links to labels that do not exist: {bad}"


# ---- parameter counts: MLA layer, DeepSeek-V3 ---------------------------------------------

def test_mla_parameters_counts_the_module():
    from attnlab.mla import mla_parameters

    mla = MultiHeadLatentAttention(d_model=64, n_heads=4, d_head=8, d_latent=16, d_rope=4)
    # the module has no low-rank query and no latent norm: subtract the norm gain counted for c
    assert mla_parameters(64, 4, 8, 16, 4) - 16 == sum(p.numel() for p in mla.parameters())
    with pytest.raises(ValueError, match="d_latent"):
        mla_parameters(64, 4, 8, 0, 4)


def test_deepseek_v3_total_and_active_parameters():
    from attnlab.mla import mla_parameters
    from attnlab.moe import moe_model_parameters

    attn = mla_parameters(7168, 128, 128, 512, 64, d_q_latent=1536)
    v3 = moe_model_parameters(n_layers=61, n_dense_layers=3, d_model=7168, d_ff_dense=18432, d_ff_expert=2048,
                              n_routed=256, n_shared=1, top_k=8, attention_per_layer=attn, vocab=129280)
    assert round(v3["total"] / 1e9) == 671                        # DeepSeek-V3 report: 671B total
    assert 36.5e9 < v3["active"] - v3["embeddings"] // 2 < 37.5e9  # and 37B activated
    dense = moe_model_parameters(n_layers=2, n_dense_layers=2, d_model=8, d_ff_dense=16, d_ff_expert=4,
                                 n_routed=4, n_shared=0, top_k=4, attention_per_layer=0, vocab=10)
    assert dense["total"] == dense["active"] == 2 * (2 * 8 + 3 * 8 * 16) + 2 * 10 * 8 + 8
    with pytest.raises(ValueError, match="top_k"):
        moe_model_parameters(n_layers=2, n_dense_layers=0, d_model=8, d_ff_dense=16, d_ff_expert=4,
                             n_routed=4, n_shared=0, top_k=5, attention_per_layer=0, vocab=10)


# ---- the shipped speculative-decoding measurement -----------------------------------------

def test_speculative_bench_file_is_consistent():
    from attnlab.experiments import speculative_bench

    data = speculative_bench.load()
    assert data["command"] == "python -m attnlab.experiments.speculative_bench" and data["threads"] == 1
    gammas = sorted(p["gamma"] for p in data["points"] if "gamma" in p)
    assert gammas == list(speculative_bench.GAMMAS)
    for p in data["points"]:
        if "gamma" not in p:
            assert 0 < p["cost_ratio_cpu"] < 1 and 0 < p["beta_mean"] < 1
            continue
        assert p["tokens"] == data["prompts"] * data["seeds"] * data["new_tokens"]
        assert 1 <= p["tokens_per_pass"] <= p["gamma"] + 1
        assert p["tokens"] == p["accepted"] + p["steps"]            # one correction or bonus per pass
        assert p["alpha"] == pytest.approx(p["accepted"] / (p["accepted"] + p["rejected"]))
        seeds = p["per_seed"]                                       # the totals are the seeds' sums
        assert len(seeds) == data["seeds"]
        for key in ("steps", "accepted", "rejected", "tokens", "spec_cpu_s", "plain_cpu_s",
                    "plain_target_cpu_s", "plain_target_calls"):
            assert p[key] == pytest.approx(sum(r[key] for r in seeds)), key
        for r in seeds:
            assert r["plain_target_calls"] == r["tokens"]               # plain: one call per token
            assert 0 < r["plain_target_cpu_s"] < r["plain_cpu_s"]


def test_speculative_bench_smoke_runs():
    from attnlab.experiments.microgpt import load_pretrained
    from attnlab.experiments.speculative_bench import run_gamma

    target, corpus = load_pretrained("target")
    draft, _ = load_pretrained("draft")
    point = run_gamma(target, draft, corpus, 2, n_prompts=1, seeds=1, new_tokens=12)
    assert point["tokens"] == 12 == point["accepted"] + point["steps"]
    assert point["target_calls"] == point["steps"] and point["draft_calls"] <= 2 * point["steps"]
    assert point["plain_target_calls"] == 12 and len(point["per_seed"]) == 1
