"""Transfer questions of chapter 14: each answer computed with attnlab (see test_quiz_answers.py)."""
import math

from quiz_checks import GiB, accepts


def test_14_speculative_tokens_per_pass():
    from attnlab.speculative import expected_tokens_per_step
    accepts("14-speculative-tokens-per-pass", expected_tokens_per_step(0.8, 4))


def test_14_speculative_cached_speedup():
    from attnlab.speculative import expected_speedup, expected_tokens_per_step
    verify_cost = 1.5                                   # a cached verify pass, in plain steps
    speedup = expected_tokens_per_step(0.8, 4) / (4 * 0.3 + verify_cost)
    assert expected_speedup(0.8, 4, 0.3) > speedup + 0.2                # what the formula assumes
    accepts("14-speculative-cached-speedup", speedup)


def test_14_mla_v2_cache_kib():
    from attnlab.kv_cache import mla_cache_bytes
    accepts("14-mla-v2-cache-kib", mla_cache_bytes(60, 512, 64, 1, bytes_per_element=2) / 1024)


def test_14_paged_waste_slots():
    tokens, block = 1000, 16
    accepts("14-paged-waste-slots", math.ceil(tokens / block) * block - tokens)


def test_14_ring_send_per_step_p16_gib():
    from attnlab.ring import ring_costs
    n, d, heads, devices = 2**20, 128, 32, 16
    cost = ring_costs(n, d, devices, n_heads=heads)
    per_step = 2 * cost["block length"] * heads * d * 2                 # K and V, bf16
    assert per_step * (devices - 1) == cost["sent per device"]          # P − 1 steps send
    accepts("14-ring-send-per-step-p16-gib", per_step / GiB)


def test_14_mha_cache_per_token():
    from attnlab.kv_cache import kv_cache_bytes
    accepts("14-mha-cache-per-token", kv_cache_bytes(1, 128, 128, 1, bytes_per_element=1))


def test_14_vit_patch_count():
    import torch
    image = torch.zeros(224, 224)
    patches = image.unfold(0, 16, 16).unfold(1, 16, 16).reshape(-1, 16 * 16)
    accepts("14-vit-patch-count", patches.shape[0])


def test_14_nsa_keys_32k():
    from attnlab.nsa import keys_attended
    counts = keys_attended(32768, block=64, n_selected=16, window=512, compress_block=32,
                           compress_stride=16)
    accepts("14-nsa-keys-32k", counts["compressed"] + counts["selected"] + counts["window"])


def test_14_mod_flop_fraction():
    from attnlab.mod import block_flops_fraction
    accepts("14-mod-flop-fraction", block_flops_fraction(1 / 8, 4096, 1024))


def test_14_mtp_tokens_per_pass():
    from attnlab.speculative import expected_tokens_per_step
    accepts("14-mtp-tokens-per-pass", expected_tokens_per_step(0.8, 2))


def test_14_v3_active_top4():
    from attnlab.mla import mla_parameters
    from attnlab.moe import moe_model_parameters
    attn = mla_parameters(7168, 128, 128, 512, 64, d_q_latent=1536)
    counts = {k: moe_model_parameters(n_layers=61, n_dense_layers=3, d_model=7168, d_ff_dense=18432,
                                      d_ff_expert=2048, n_routed=256, n_shared=1, top_k=k,
                                      attention_per_layer=attn, vocab=129280) for k in (8, 4)}
    assert round(counts[8]["active"] / 1e9, 2) == 37.55                 # the stem's figure
    assert counts[4]["total"] == counts[8]["total"]
    accepts("14-v3-active-top4", counts[4]["active"] / 1e9)
