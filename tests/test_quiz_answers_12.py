"""Transfer questions of chapter 12: each answer computed with attnlab (see test_quiz_answers.py).

The numbers are new configurations, not ones the chapter prints, so the questions test transfer."""
import torch

from quiz_checks import GiB, MiB, accepts, correct_option, flops


def test_12_jamba_attention_layers():
    from attnlab.hybrid import jamba_pattern
    pattern = jamba_pattern(40, attn_period=6, attn_offset=2)
    assert [i for i, s in enumerate(pattern) if s.mixer == "attention"] == [2, 8, 14, 20, 26, 32, 38]
    accepts("12-jamba-attention-layers", sum(s.mixer == "attention" for s in pattern))


def test_12_hybrid_cost_growth():
    from attnlab.hybrid import forward_flops, local_exponent
    d, layers, r = 2048, 32, 1 / 4
    per_token = forward_flops(1, d, layers, r)
    quad = per_token["attention (quadratic)"]
    crossover = (per_token["total"] - quad) / quad                  # quadratic = the rest at N*
    assert 55_000 < crossover < 57_000
    ns = [2**22, 2**24]
    assert local_exponent(ns, [forward_flops(n, d, layers, r)["total"] for n in ns])[0] > 1.9
    option = correct_option("12-hybrid-cost-growth")
    assert option.startswith("As N²") and f"near {round(crossover / 1000)}K tokens" in option


def test_12_griffin_recurrent_per_attention():
    from attnlab.hybrid import attention_fraction, griffin_pattern
    pattern = griffin_pattern(28)
    assert sum(s.mixer == "local_attention" for s in pattern) == 9
    accepts("12-griffin-recurrent-per-attention", attention_fraction(pattern, include_local=True))


def test_12_switch_loss_extremes():
    from attnlab.moe import switch_load_balancing_loss
    E, k, T = 16, 2, 64
    probs = torch.zeros(T, E)
    probs[:, 0] = 1.0                                        # all probability on expert 0
    index = torch.tensor([[0, 1]] * T)                      # every token to experts 0 and 1
    largest = switch_load_balancing_loss(probs, index, E).item()
    balanced = switch_load_balancing_loss(torch.full((T, E), 1 / E), torch.arange(T * k).view(T, k) % E, E).item()
    assert abs(balanced - 1) < 1e-6
    g = torch.Generator().manual_seed(0)                     # no routing of random logits goes above E / k
    for _ in range(20):
        p = torch.softmax(3 * torch.randn(T, E, generator=g), -1)
        assert switch_load_balancing_loss(p, p.topk(k).indices, E).item() <= E / k + 1e-6
    accepts("12-switch-loss-extremes", largest)


def test_12_zamba_calls_54_layers():
    from attnlab.hybrid import zamba_pattern, zamba_shared_layers
    calls = zamba_shared_layers(54, shared_every=6)
    assert calls == [2, 7, 13, 19, 25, 31, 37, 43, 49]
    assert sum(s.mixer == "shared_attention" for s in zamba_pattern(54)) == len(calls)
    accepts("12-zamba-calls-54-layers", len(calls))


def test_12_moe_top2_expert_gflops():
    from attnlab.blocks import FeedForward
    from attnlab.hybrid import ffn_parameters
    from attnlab.moe import MoEFeedForward
    d, d_ff, top_k = 2048, 8192, 2
    per_expert = 2 * ffn_parameters(d, d_ff, glu=True)           # 2 FLOPs per weight per token
    # the library's MoE layer runs top_k full experts per token (checked on small two-matrix experts)
    moe, dense, x = MoEFeedForward(16, 32, n_experts=8, top_k=top_k), FeedForward(16, 32), torch.randn(1, 10, 16)
    assert flops(lambda: moe(x)) - 2 * 10 * 16 * 8 == top_k * flops(lambda: dense(x))
    accepts("12-moe-top2-expert-gflops", top_k * per_expert / 1e9)


def test_12_kv_budget_tokens():
    from attnlab.kv_cache import kv_cache_bytes
    per_token = kv_cache_bytes(8, 8, 128, 1, bytes_per_element=2)
    accepts("12-kv-budget-tokens", 16 * GiB // per_token)


def test_12_rglru_horizon_099():
    from attnlab.rglru import memory_horizon
    accepts("12-rglru-horizon-099", memory_horizon(0.99))


def test_12_griffin_window_cache_mib():
    from attnlab.hybrid import HybridConfig, HybridLM, griffin_pattern
    from attnlab.kv_cache import kv_cache_bytes
    n_tokens, window = 100_000, 2048
    with torch.device("meta"):                                # RecurrentGemma-2B's width: 10 heads of 256
        model = HybridLM(griffin_pattern(26), HybridConfig(d_model=2560, n_heads=10, window=window))
    local = [layer.mixer.attn for layer in model.layers if layer.spec.mixer == "local_attention"]
    assert len(local) == 8 and {(a.n_kv_heads, a.head_dim) for a in local} == {(1, 256)}
    numbers = sum(2 * a.n_kv_heads * a.head_dim * min(n_tokens, window) for a in local)
    assert numbers * 2 == kv_cache_bytes(8, 1, 256, window, bytes_per_element=2)
    accepts("12-griffin-window-cache-mib", numbers * 2 / MiB)


def test_12_hyena_decode_state():
    from attnlab.hyena import HyenaOperator
    with torch.device("meta"):
        op = HyenaOperator(2048, short_filter=3, filter_state=3)
    state = op.init_state(1)
    assert sum(t.numel() for t in state) == op.state_size()   # the state that decoding actually keeps
    accepts("12-hyena-decode-state", op.state_size())
