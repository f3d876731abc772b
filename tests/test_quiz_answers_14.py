"""Transfer questions of chapter 14: each answer computed with attnlab (see test_quiz_answers.py)."""
import math

from quiz_checks import GiB, accepts


def test_14_spec_tokens_alpha06_gamma3():
    from attnlab.speculative import expected_tokens_per_step
    accepts("14-spec-tokens-alpha06-gamma3", expected_tokens_per_step(0.6, 3))


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


def test_14_mha64_cache_per_token():
    from attnlab.kv_cache import kv_cache_bytes
    accepts("14-mha64-cache-per-token", kv_cache_bytes(1, 64, 192, 1, bytes_per_element=1))


def test_14_vit_patch_count_336_14():
    import torch
    image = torch.zeros(336, 336)
    patches = image.unfold(0, 14, 14).unfold(1, 14, 14).reshape(-1, 14 * 14)
    accepts("14-vit-patch-count-336-14", patches.shape[0])
