"""Hybrid architectures: every mixer's forms agree, every mixer and pattern is causal, the calculators
reproduce the published numbers and the toy modules' own parameter counts."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnlab.attention import MultiHeadAttention
from attnlab.blocks import count_parameters
from attnlab.hybrid import (
    JAMBA_V01, LLAMA2_7B, MIXTRAL_8X7B, HybridConfig, HybridLM, LayerSpec, ModelConfig, SharedAttentionBlock,
    attention_fraction, build_mixer, decode_state_bytes, decode_state_numbers, forward_flops, griffin_pattern,
    jamba_pattern, local_exponent,
    lower_block_rank, mamba_parameters, mixing_matrix, parameter_count, pattern_string, semiseparable_matrix,
    ssm_state_bytes, striped_hyena_pattern, uniform_pattern, zamba_pattern, zamba_shared_layers,
)
from attnlab.hyena import HyenaOperator, causal_conv_direct, toeplitz
from attnlab.kv_cache import PRESETS
from attnlab.moe import MoEFeedForward, expert_load, switch_load_balancing_loss, toy_routing_run
from attnlab.numerics import agrees
from attnlab.rglru import RGLRU, GriffinRecurrentBlock, linear_recurrence, memory_horizon, rg_lru, stationary_variance
from attnlab.viz import layer_stripes, matrix_gallery
from attnlab.ssm import Mamba, MambaConfig, lti_convolution, selective_scan

F64 = torch.float64
GIB = 2**30
SMALL = HybridConfig(vocab=32, d_model=16, n_heads=2, window=3, d_state=4, n_experts=4, top_k=2)
MIXER_KINDS = ["attention", "local_attention", "linear_attention", "mamba", "rglru", "hyena"]
PATTERNS = {
    "jamba": jamba_pattern(8),
    "zamba": zamba_pattern(6, shared_every=3),
    "griffin": griffin_pattern(6),
    "striped_hyena": striped_hyena_pattern(4),
    "transformer": uniform_pattern("attention", 2),
    "mamba": uniform_pattern("mamba", 2, None),
}


# --- the forms of each mixer agree ---------------------------------------------------------------

@given(b=st.integers(1, 3), length=st.integers(1, 70), d=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_linear_recurrence_scan_equals_loop(b, length, d, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(b, length, d, generator=g, dtype=F64)
    x = torch.randn(b, length, d, generator=g, dtype=F64)
    loop = linear_recurrence(a, x, method="loop")
    assert torch.allclose(linear_recurrence(a, x, method="scan"), loop, rtol=1e-12, atol=1e-12)
    assert agrees(linear_recurrence(a.float(), x.float(), method="scan"),
                  linear_recurrence(a.float(), x.float(), method="loop"), loop)


def test_rg_lru_scan_equals_loop_in_values_and_gradients():
    torch.manual_seed(0)
    layer = RGLRU(6).double()
    x = torch.randn(2, 45, 6, dtype=F64, requires_grad=True)
    outs, grads = [], []
    for method in ("loop", "scan"):
        y = layer(x, method=method)
        outs.append(y)
        grads.append(torch.autograd.grad(y.square().sum(), (x, layer.a_param)))
    assert torch.allclose(outs[0], outs[1], atol=1e-12)
    assert all(torch.allclose(g0, g1, atol=1e-10) for g0, g1 in zip(*grads))


def test_rg_lru_decay_is_sigma_lambda_to_the_c_r():
    x = torch.ones(1, 1, 3, dtype=F64)
    gate_a = torch.tensor([[[0.0, 0.5, 1.0]]], dtype=F64)
    log_a = torch.log(torch.tensor([0.9, 0.9, 0.9], dtype=F64))
    h = rg_lru(x, gate_a, torch.ones_like(x), log_a, c=8.0)
    a_t = 0.9 ** (8 * gate_a)                                     # σ(Λ)^{c r_t}
    assert torch.allclose(h, torch.sqrt(1 - a_t**2))              # first step: h_0 = √(1 − a²) x


def test_rg_lru_normalisation_bounds_the_variance():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 3000, 1, generator=g, dtype=F64)
    ones = torch.ones_like(x)
    for a in (0.9, 0.99):
        log_a = torch.tensor([math.log(a) / 8], dtype=F64)         # so that a_t = a at r = 1
        kept = rg_lru(x, ones, ones, log_a, method="scan")[:, -1].var().item()
        raw = rg_lru(x, ones, ones, log_a, normalize=False, method="scan")[:, -1].var().item()
        assert abs(kept - 1) < 0.25 and abs(raw * (1 - a * a) - 1) < 0.25


@given(b=st.integers(1, 2), length=st.integers(1, 60), d=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_fft_convolution_equals_direct(b, length, d, seed):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(b, d, length, generator=g, dtype=F64)
    h = torch.randn(d, length, generator=g, dtype=F64)
    direct = causal_conv_direct(u, h)
    loop = torch.stack([sum(h[:, t - s] * u[..., s] for s in range(t + 1)) for t in range(length)], dim=-1)
    assert torch.allclose(direct, loop, atol=1e-12)
    assert torch.allclose(lti_convolution(u, h), direct, atol=1e-10)
    assert agrees(lti_convolution(u.float(), h.float()), causal_conv_direct(u.float(), h.float()), direct)


def test_toeplitz_is_constant_along_diagonals():
    h = torch.arange(1.0, 6.0)
    t = toeplitz(h)
    assert torch.equal(torch.diagonal(t, -2), torch.full((3,), 3.0)) and torch.equal(t.triu(1), torch.zeros(5, 5))


@pytest.mark.parametrize("length", [1, 2, 63])
@pytest.mark.parametrize("d,filter_state", [(1, 1), (5, 3), (3, 1)])
def test_hyena_three_forms_agree_in_values_and_gradients(length, d, filter_state):
    torch.manual_seed(1)
    op = HyenaOperator(d, filter_state=filter_state).double()
    with torch.no_grad():
        op.D.normal_()                                              # D starts at 0; exercise its path too
    u = torch.randn(2, length, d, dtype=F64, requires_grad=True)
    outs, grads = {}, {}
    for method in ("fft", "direct", "recurrent"):
        outs[method] = op(u, method=method)
        grads[method] = torch.autograd.grad(outs[method].square().sum(), (u, op.filter.log_rate, op.filter.residue))
    for method in ("direct", "recurrent"):
        assert torch.allclose(outs[method], outs["fft"], atol=1e-11), method
        assert all(torch.allclose(g, g_fft, atol=1e-10) for g, g_fft in zip(grads[method], grads["fft"])), method
    op32 = HyenaOperator(d, filter_state=filter_state).float()
    op32.load_state_dict(op.state_dict())
    u32 = u.detach().float()
    for method in ("fft", "direct", "recurrent"):
        assert agrees(op32(u32, method=method), op32(u32, method="direct"), outs["direct"].detach()), method


@given(length=st.integers(1, 40), d=st.integers(1, 4), filter_state=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_hyena_forms_agree_for_any_shape(length, d, filter_state, seed):
    torch.manual_seed(seed)
    op = HyenaOperator(d, filter_state=filter_state).double()
    u = torch.randn(1, length, d, dtype=F64)
    fft = op(u, method="fft")
    assert fft.shape == u.shape
    for method in ("direct", "recurrent"):
        assert torch.allclose(op(u, method=method), fft, atol=1e-11), method


def test_hyena_gradients_match_finite_differences():
    torch.manual_seed(0)
    op = HyenaOperator(2, filter_state=2).double()
    u = torch.randn(1, 7, 2, dtype=F64, requires_grad=True)
    for method in ("fft", "recurrent"):
        assert torch.autograd.gradcheck(lambda z: op(z, method=method), (u,)), method


def test_semiseparable_matrix_equals_the_selective_scan():
    g = torch.Generator().manual_seed(0)
    length, n = 23, 4
    u = torch.randn(length, generator=g, dtype=F64)
    delta = torch.rand(length, generator=g, dtype=F64) * 0.5 + 0.05
    A = -torch.rand(n, generator=g, dtype=F64) * 3 - 0.1
    B, C = torch.randn(2, length, n, generator=g, dtype=F64)
    M = semiseparable_matrix(delta, A, B, C)
    scan = selective_scan(u.view(1, 1, -1), delta.view(1, 1, -1), A.view(1, -1), B.T.unsqueeze(0), C.T.unsqueeze(0))
    assert torch.allclose(M @ u, scan.view(-1), atol=1e-12)
    assert lower_block_rank(M) <= n


def test_softmax_attention_is_not_low_rank_below_the_diagonal():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 24, 4, generator=g, dtype=F64)
    weights = torch.softmax((q @ k.T).masked_fill(torch.ones(24, 24, dtype=torch.bool).triu(1), -math.inf), -1)
    assert lower_block_rank(weights) > 4                          # more than its head dimension


# --- causality ------------------------------------------------------------------------------------

def _future_changes_past(fn, x, t):
    y = fn(x)
    x2 = x.clone()
    x2[:, t:] = torch.randn_like(x2[:, t:])
    return (fn(x2)[:, :t] - y[:, :t]).abs().max().item()


@pytest.mark.parametrize("kind", MIXER_KINDS)
def test_every_mixer_is_causal(kind):
    torch.manual_seed(0)
    mixer = build_mixer(kind, SMALL).double()
    x = torch.randn(2, 19, SMALL.d_model, dtype=F64)
    for t in (1, 7, 18):
        assert _future_changes_past(mixer, x, t) < 1e-12, (kind, t)


def test_shared_attention_block_is_causal():
    torch.manual_seed(0)
    block = SharedAttentionBlock(8, 2).double()
    x, e = torch.randn(2, 2, 15, 8, dtype=F64)
    assert _future_changes_past(lambda z: block(z, e), x, 6) < 1e-12
    assert _future_changes_past(lambda z: block(x, z), e, 6) < 1e-12


@pytest.mark.parametrize("name", list(PATTERNS))
def test_every_pattern_is_causal(name):
    torch.manual_seed(0)
    model = HybridLM(PATTERNS[name], SMALL).double()
    tokens = torch.randint(0, SMALL.vocab, (2, 17))
    logits = model(tokens)
    assert logits.shape == (2, 17, SMALL.vocab) and torch.isfinite(logits).all()
    for t in (1, 9):
        changed = tokens.clone()
        changed[:, t:] = (changed[:, t:] + 1) % SMALL.vocab
        assert (model(changed)[:, :t] - logits[:, :t]).abs().max() < 1e-12, (name, t)


@pytest.mark.parametrize("kind", MIXER_KINDS)
def test_mixing_matrix_is_lower_triangular(kind):
    torch.manual_seed(0)
    mixer = build_mixer(kind, SMALL).double()
    M = mixing_matrix(mixer, torch.randn(12, SMALL.d_model, dtype=F64))
    assert M.shape == (12, 12) and M.triu(1).abs().max() < 1e-12 and M.diagonal().min() > 0


def test_local_attention_sees_only_its_window():
    torch.manual_seed(0)
    M = mixing_matrix(build_mixer("local_attention", SMALL).double(), torch.randn(12, SMALL.d_model, dtype=F64))
    lag = torch.arange(12).unsqueeze(-1) - torch.arange(12)
    assert M[lag > SMALL.window].abs().max() < 1e-12 and M[(lag >= 0) & (lag <= SMALL.window)].min() > 0


def test_mixing_matrix_of_a_convolution_is_toeplitz():
    h = torch.randn(1, 10, dtype=F64)
    M = mixing_matrix(lambda x: lti_convolution(x.transpose(1, 2), h).transpose(1, 2), torch.randn(10, 1, dtype=F64))
    assert torch.allclose(M, toeplitz(h[0]).abs(), atol=1e-12)


# --- patterns ------------------------------------------------------------------------------------

def test_jamba_pattern():
    pattern = jamba_pattern()
    mixers, ffns = pattern_string(pattern)
    assert [i for i, m in enumerate(mixers) if m == "A"] == [4, 12, 20, 28]
    assert mixers.count("M") == 28 and attention_fraction(pattern) == 1 / 8          # 1 : 7, not 1 : 8
    assert [i for i, f in enumerate(ffns) if f == "E"] == list(range(1, 32, 2))
    assert JAMBA_V01.pattern() == pattern


def test_zamba_shares_one_block():
    model = HybridLM(zamba_pattern(12), SMALL)
    calls = [layer for layer in model.layers if layer.spec.mixer == "shared_attention"]
    assert len(calls) == 2 and calls[0].shared is calls[1].shared and calls[0].proj is not calls[1].proj
    unshared = count_parameters(model.shared)
    assert count_parameters(model) == sum(count_parameters(m) for n, m in model.named_children()
                                          if n != "layers") + sum(
        count_parameters(l) - (unshared if l.spec.mixer == "shared_attention" else 0) for l in model.layers)


def test_zamba_call_sites_follow_the_released_configuration():
    # Hugging Face ZambaConfig._layers_block_type with 76 layers, period 6, offset 4
    reference = ["mamba", "mamba", "hybrid"] + ["hybrid" if i % 6 == 4 else "mamba" for i in range(76 - 3)]
    calls = zamba_shared_layers(76, 6)
    assert calls == [i for i, kind in enumerate(reference) if kind == "hybrid"]
    assert calls[:3] == [2, 7, 13] and calls[-1] == 73 and len(calls) == 13
    pattern = zamba_pattern(76)
    mixers, ffns = pattern_string(pattern)
    assert len(pattern) == 89 and mixers.count("S") == 13 and mixers.count("M") == 76 and set(ffns) == {"·"}
    assert all(mixers[i + 1] == "M" for i, m in enumerate(mixers) if m == "S")      # each call feeds a Mamba layer


def _zamba_reference(model, embeddings):
    """Zyphra's wiring (ZambaHybridLayer, ZambaAttentionDecoderLayer), written independently of HybridLM."""
    x, s = embeddings, None
    for layer in model.layers:
        if layer.spec.mixer == "shared_attention":
            block = layer.shared
            h = block.attn(block.norm_in(torch.cat([x, embeddings], -1)), causal=True)
            s = layer.proj(block.ffn(block.norm_ff(h)))                   # no residual inside the block
        else:
            residual = x
            x = residual + layer.mixer(layer.norm(x if s is None else x + s))   # s joins the input only
            s = None
    return x


def test_zamba_shared_output_joins_the_next_mamba_input_not_the_stream():
    torch.manual_seed(0)
    model = HybridLM(zamba_pattern(9, shared_every=3), SMALL).double()
    tokens = torch.randint(0, SMALL.vocab, (2, 11))
    e = model.embed_tokens(tokens)
    states = model.hidden_states(e)
    assert torch.allclose(states[-1], _zamba_reference(model, e), atol=1e-12)
    for i, spec in enumerate(model.pattern):
        if spec.mixer == "shared_attention":                         # the stream passes a call site unchanged
            assert torch.equal(states[i], states[i - 1] if i else e)
    block = model.shared
    x = torch.randn(2, 11, SMALL.d_model, dtype=F64)
    a = block.attn(block.norm_in(torch.cat([x, e], -1)), causal=True)
    assert torch.allclose(block(x, e), block.ffn(block.norm_ff(a)), atol=1e-14)


def test_a_shared_call_must_feed_a_layer():
    with pytest.raises(ValueError, match="shared_attention entry must be followed"):
        HybridLM([LayerSpec("mamba", None), LayerSpec("shared_attention", None)], SMALL)
    with pytest.raises(ValueError, match="its ffn must be None"):
        HybridLM([LayerSpec("shared_attention", "mlp"), LayerSpec("mamba", None)], SMALL)


def test_attention_fraction_counts_layers_not_shared_calls():
    assert attention_fraction(zamba_pattern(76)) == 13 / 76              # 0.171: the chapter's number
    assert attention_fraction(jamba_pattern(32)) == 1 / 8
    assert attention_fraction(griffin_pattern(12)) == 0
    with pytest.raises(ValueError, match="no layer besides"):
        attention_fraction([LayerSpec("shared_attention", None)])


@pytest.mark.parametrize("builder", [jamba_pattern, griffin_pattern, striped_hyena_pattern, zamba_pattern])
def test_pattern_builders_reject_zero_layers(builder):
    with pytest.raises(ValueError, match="must be a positive int"):
        builder(0)


def test_griffin_and_striped_hyena_patterns():
    assert pattern_string(griffin_pattern(6))[0] == "RRWRRW"
    assert attention_fraction(griffin_pattern(12), include_local=True) == 1 / 3
    assert pattern_string(striped_hyena_pattern(32))[0] == "HA" * 16
    assert pattern_string(striped_hyena_pattern(32, (8, 16, 24)))[0].count("A") == 3
    with pytest.raises(ValueError, match="attention_layers"):
        striped_hyena_pattern(8, (9,))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="mixer"):
        LayerSpec("transformer")
    with pytest.raises(ValueError, match="tokens"):
        HybridLM(jamba_pattern(8), SMALL)(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"a and x"):
        linear_recurrence(torch.rand(2, 3, 4), torch.rand(2, 3))
    with pytest.raises(ValueError, match=r"\(b, L, d_model=16\)"):
        GriffinRecurrentBlock(16)(torch.randn(2, 5, 8))


def test_moe_pattern_adds_an_aux_loss():
    torch.manual_seed(0)
    model = HybridLM(jamba_pattern(8), SMALL).double()
    routed = []
    for layer in model.layers:
        if layer.spec.ffn == "moe":
            layer.ffn.router.register_forward_hook(lambda mod, inp, out: routed.append(out))
    model(torch.randint(0, SMALL.vocab, (2, 9)))
    assert len(routed) == 4                                                       # 4 MoE layers
    by_hand = 0.0
    for probs, _, index in routed:                                                # E Σ_i f_i P_i per layer
        E = probs.shape[-1]
        f = torch.stack([(index == i).sum() for i in range(E)]).double() / index.numel()
        by_hand += E * (f * probs.mean(0)).sum().item()
    assert math.isclose(model.aux_loss().item(), by_hand, rel_tol=1e-6)


def test_switch_loss_is_not_bounded_below_by_one():
    # two experts, top-1: three tokens at p = (0.51, 0.49) go to expert 0, one at p = (0, 1) to expert 1
    probs = torch.tensor([[0.51, 0.49]] * 3 + [[0.0, 1.0]], dtype=F64)
    index = torch.tensor([[0], [0], [0], [1]])
    loss = switch_load_balancing_loss(probs, index, 2).item()
    assert math.isclose(loss, 2 * (0.75 * 0.3825 + 0.25 * 0.6175), rel_tol=1e-9) and loss < 1   # 0.8825


def test_switch_loss_is_at_most_E_over_k():
    E, k, T = 8, 2, 16
    probs = torch.zeros(T, E, dtype=F64)
    probs[:, 0] = 1.0                                      # all probability on expert 0 ...
    index = torch.tensor([[0, 1]] * T)                     # ... and every token sent to experts 0 and 1
    assert math.isclose(switch_load_balancing_loss(probs, index, E).item(), E / k)


# --- calculators -----------------------------------------------------------------------------------

def test_jamba_parameters_from_its_config():
    p = parameter_count(JAMBA_V01)
    assert round(p["total"] / 1e9, 1) == 51.6 and round(p["active"] / 1e9, 1) == 12.1
    assert round(p["active"] / p["total"], 3) == 0.235                  # not k / E = 1/8


def test_mixtral_and_llama_parameters():
    mixtral, llama = parameter_count(MIXTRAL_8X7B), parameter_count(LLAMA2_7B)
    assert round(mixtral["total"] / 1e9, 1) == 46.7 and round(mixtral["active"] / 1e9, 1) == 12.9
    assert round(llama["total"] / 1e9, 2) == 6.74 and llama["active"] == llama["total"]


@pytest.mark.parametrize("attn_period,n_experts", [(8, 4), (1, 1), (3, 2)])
def test_calculator_counts_the_toy_modules_exactly(attn_period, n_experts):
    cfg = ModelConfig("toy", vocab=32, d_model=16, n_layers=6, n_heads=2, n_kv_heads=2, d_ff=64,
                      attn_period=attn_period, attn_offset=attn_period // 2, n_experts=n_experts, top_k=1,
                      expert_period=2, expert_offset=1, d_state=4, glu=False, ffn_bias=True)
    toy = HybridConfig(vocab=32, d_model=16, n_heads=2, d_ff=64, d_state=4, n_experts=n_experts, top_k=1)
    assert count_parameters(HybridLM(cfg.pattern(), toy)) == parameter_count(cfg)["total"]


def test_mamba_parameter_formula():
    for d in (16, 48):
        assert mamba_parameters(d, 8) == count_parameters(Mamba(MambaConfig(d_model=d, d_state=8)))
    assert 6 <= mamba_parameters(4096) / 4096**2 < 6.5


def test_cache_and_state_at_256k():
    n = 256 * 1024
    sizes = {name: PRESETS[name].bytes(n) / GIB for name in ("Jamba-v0.1", "Mixtral-8x7B", "Llama-2-7B")}
    assert sizes == {"Jamba-v0.1": 4, "Mixtral-8x7B": 32, "Llama-2-7B": 128}
    assert round(ssm_state_bytes(28, 8192) / 1e6, 1) == 8.7


def test_hybrids_stay_quadratic():
    ns = [2**k for k in range(20, 27)]
    exponents = {r: local_exponent(ns, [forward_flops(n, 4096, 32, r)["total"] for n in ns])[-1]
                 for r in (0, 1 / 8, 1 / 4, 1)}
    assert abs(exponents[0] - 1) < 1e-9 and all(e > 1.9 for r, e in exponents.items() if r > 0)
    quad = {r: forward_flops(1000, 64, 8, r)["attention (quadratic)"] for r in (1 / 8, 1)}
    assert quad[1 / 8] * 8 == quad[1]


# --- mixture of experts ----------------------------------------------------------------------------

def test_switch_loss_is_one_when_balanced_and_E_when_collapsed():
    E, T = 4, 8
    uniform = torch.full((T, E), 1 / E)
    balanced = torch.arange(T).remainder(E).unsqueeze(-1)
    assert torch.isclose(switch_load_balancing_loss(uniform, balanced, E), torch.tensor(1.0))
    collapsed = torch.zeros(T, E)
    collapsed[:, 0] = 1
    assert torch.isclose(switch_load_balancing_loss(collapsed, torch.zeros(T, 1, dtype=torch.long), E),
                         torch.tensor(float(E)))
    assert torch.equal(expert_load(balanced, E), torch.full((E,), 0.25))


def test_moe_equals_a_per_token_loop():
    torch.manual_seed(0)
    moe = MoEFeedForward(8, 16, n_experts=5, top_k=2).double()
    x = torch.randn(3, 7, 8, dtype=F64)
    probs = torch.softmax(moe.router.gate(x), -1)
    expected = torch.zeros_like(x)
    for b in range(3):
        for t in range(7):
            w, idx = probs[b, t].topk(2)
            expected[b, t] = sum(w_i * moe.experts[i](x[b, t]) for w_i, i in zip(w, idx.tolist()))
    assert torch.allclose(moe(x), expected, atol=1e-12)


def test_balancing_loss_prevents_expert_collapse():
    free, balanced = (toy_routing_run(alpha, seed=0) for alpha in (0.0, 0.1))
    assert torch.equal(free["load_init"], balanced["load_init"])         # the same start, measured before any step
    assert int((free["load_init"] < 0.01).sum()) == 0                     # every expert alive at initialisation
    assert int((free["load"] < 0.01).sum()) >= 2 and int((balanced["load"] < 0.01).sum()) == 0
    assert balanced["entropy"][-1] > 2.7 > free["entropy"][-1]       # log2(8) = 3 bits when perfectly balanced


def test_a_two_dimensional_router_input_starts_with_dead_experts():
    run = toy_routing_run(0.0, seed=0, steps=1, in_dim=2)
    assert int((run["load_init"] < 0.01).sum()) >= 2                    # empty regions of the plane, before training


def test_state_size_grows_only_for_global_attention():
    sizes = {name: [HybridLM(p, SMALL).state_size(n) for n in (10, 20, 40)] for name, p in (
        ("attention", uniform_pattern("attention", 1)), ("window", uniform_pattern("local_attention", 1)),
        ("mamba", uniform_pattern("mamba", 1)), ("linear", uniform_pattern("linear_attention", 1)),
        ("griffin", griffin_pattern(3)), ("hyena", uniform_pattern("hyena", 1)))}
    assert sizes["attention"] == [2 * 16 * n for n in (10, 20, 40)]
    assert sizes["window"] == [2 * 8 * SMALL.window] * 3                  # the last w tokens, one KV head of size 8 (MQA)
    assert sizes["mamba"] == [32 * (4 + 3)] * 3                           # d_inner (n + d_conv − 1)
    assert sizes["linear"] == [2 * (8 * 8 + 8)] * 3
    assert len(set(sizes["griffin"])) == 1 and len(set(sizes["hyena"])) == 1


def test_attention_module_reused_for_gqa():
    mixer = build_mixer("attention", HybridConfig(d_model=16, n_heads=4, n_kv_heads=2))
    assert isinstance(mixer.attn, MultiHeadAttention) and mixer.attn.n_kv_heads == 2


def test_memory_horizon_is_the_first_step_below_eps():
    for a in (0.5, 0.9, 0.99, 0.999):
        k = memory_horizon(a)
        assert a**k < 0.01 <= a ** (k - 1)
    assert (memory_horizon(0.9), memory_horizon(0.999), memory_horizon(0.0)) == (44, 4603, 1)
    with pytest.raises(ValueError, match="a must lie"):
        memory_horizon(1.0)


def test_moe_routing_experiment_smoke_and_shipped_file():
    from attnlab.experiments import moe_routing
    point = moe_routing.run_point(moe_routing.PointConfig(0.0, steps=5))
    assert len(point["load"]) == 8 and abs(sum(point["load"]) - 1) < 1e-4 and abs(sum(point["load_init"]) - 1) < 1e-4
    data = moe_routing.load()
    assert data["command"].startswith("python -m attnlab.experiments.moe_routing")
    dead, dead_init = moe_routing.dead_table(data["points"]), moe_routing.dead_table(data["points"], "dead_init")
    assert sorted(dead) == [(a, lr) for a in moe_routing.ALPHAS for lr in moe_routing.LRS]
    assert all(len(v) == 3 for v in dead.values())
    assert all(v == [0, 0, 0] for v in dead_init.values())                # balanced at initialisation
    assert min(dead[(0.0, 1e-2)]) >= 2                                    # collapse develops without the loss
    assert all(dead[(0.1, lr)] == [0, 0, 0] for lr in moe_routing.LRS)    # and not with it, at every rate


def test_stationary_variance():
    assert stationary_variance(0.999) == 1.0 and math.isclose(stationary_variance(0.9, normalize=False), 1 / 0.19)
    with pytest.raises(ValueError, match="a must lie"):
        stationary_variance(1.0)


def test_figure_builders():
    fig = layer_stripes({"Jamba": pattern_string(jamba_pattern(8)), "Griffin": pattern_string(griffin_pattern(6))})
    names = {t.name for t in fig.data}
    assert {"Mamba", "attention", "RG-LRU", "local attention", "mixture of experts FFN"} <= names
    assert sum(len(t.x) for t in fig.data if t.name != "mixture of experts FFN") == 14
    m = torch.rand(5, 5)
    fig = matrix_gallery([{"a": m, "b": 2 * m}, {"a": m.sqrt(), "b": m}], ["x", "y"], cols=2)
    assert len(fig.data) == 2 and len(fig.layout.sliders[0].steps) == 2
    assert abs(np.asarray(fig.data[1].z).max() - 1) < 1e-9              # each matrix scaled to its own maximum


# --- decoding one token at a time ------------------------------------------------------------------

DECODE_PATTERNS = {**PATTERNS, "linear": uniform_pattern("linear_attention", 2),
                   "short_conv": uniform_pattern("short_conv", 2), "samba": [LayerSpec("mamba"), LayerSpec("local_attention")] * 2}


@pytest.mark.parametrize("name", list(DECODE_PATTERNS))
def test_cached_decoding_equals_the_parallel_forward(name):
    torch.manual_seed(0)
    model = HybridLM(DECODE_PATTERNS[name], SMALL).double()
    tokens = torch.randint(0, SMALL.vocab, (2, 11))
    assert torch.allclose(model.decode(tokens), model(tokens), atol=1e-12)
    assert torch.equal(model.generate(tokens[:, :4], 6), model.generate(tokens[:, :4], 6, use_cache=False))
    state = model.init_state(2)
    for t in range(11):
        _, state = model.step(tokens[:, t], state)
    assert sum(decode_state_numbers(state)) == 2 * model.state_size(11)   # the state that exists is state_size's
    assert state["position"] == 11


def test_decoding_in_float32_agrees_with_float64():
    torch.manual_seed(0)
    model = HybridLM(jamba_pattern(8), SMALL).double()
    tokens = torch.randint(0, SMALL.vocab, (2, 9))
    ref = model(tokens)
    model32 = HybridLM(jamba_pattern(8), SMALL).float()
    model32.load_state_dict(model.state_dict())
    assert agrees(model32.decode(tokens), model32(tokens), ref)


def test_decoding_uses_learned_positions():
    torch.manual_seed(0)
    model = HybridLM(griffin_pattern(3), HybridConfig(vocab=16, d_model=8, n_heads=2, window=2, max_len=6)).double()
    tokens = torch.randint(0, 16, (1, 6))
    assert torch.allclose(model.decode(tokens), model(tokens), atol=1e-12)
    state = model.init_state(1)
    for t in range(6):
        _, state = model.step(tokens[:, t], state)
    with pytest.raises(ValueError, match="max_len"):
        model.step(tokens[:, 0], state)


def test_cache_grows_for_attention_only():
    torch.manual_seed(0)
    pattern = [LayerSpec("attention"), LayerSpec("local_attention"), LayerSpec("mamba"), LayerSpec("rglru"),
               LayerSpec("hyena")]
    model = HybridLM(pattern, SMALL)
    state, sizes = model.init_state(1), []
    for t in range(8):
        _, state = model.step(torch.tensor([t % SMALL.vocab]), state)
        sizes.append(decode_state_bytes(state))
    attention, window, *fixed = zip(*sizes)
    assert list(attention) == [4 * 2 * 16 * (t + 1) for t in range(8)]      # float32 K and V: 2 × 16 numbers/token
    assert list(window) == [4 * 2 * 8 * min(t + 1, SMALL.window) for t in range(8)]   # one KV head (MQA), last w
    assert all(len(set(f)) == 1 for f in fixed)
