"""Transfer questions of chapter 05: each answer computed with attnlab (see test_quiz_answers.py)."""

import torch

from quiz_checks import GiB, MiB, accepts, correct_option, flops


# --------------------------------------------------------------------------- 05 KV cache

def test_05_uncached_crossover_d256():
    from attnlab.kv_cache import decode_flops
    d = 256
    parts = lambda n: decode_flops(1, n, d, cached=False)       # noqa: E731
    crossover = next(n for n in range(d, 20 * d) if parts(n)["attention"] > parts(n)["other"])
    accepts("05-uncached-crossover-d256", crossover)


def test_05_prefill_step_ratio_p300():
    from attnlab.kv_cache import decode_flops
    d, layers, p = 2048, 24, 300
    prefill = decode_flops(p, 1, d, layers, cached=True)["total"]
    step = decode_flops(p, 2, d, layers, cached=True)["total"] - prefill
    accepts("05-prefill-step-ratio-p300", prefill / step)


def test_05_llama3_8b_cache_8k_fp8():
    from attnlab.kv_cache import PRESETS, kv_cache_bytes
    spec = PRESETS["Llama-3-8B"]
    size = kv_cache_bytes(spec.n_layers, spec.n_kv_heads, spec.head_dim, 8192, batch=6, bytes_per_element=1)
    assert size == spec.bytes(8192, 6, 1)
    accepts("05-llama3-8b-cache-8k-fp8", size / GiB)


def test_05_mistral_window_cache_10k():
    from attnlab.kv_cache import PRESETS
    spec = PRESETS["Mistral-7B"]
    assert spec.window == 4096 and spec.label == "Mistral-7B v0.1"
    accepts("05-mistral-window-cache-10k", spec.bytes(10_000, 8, 2) / GiB)


def test_05_cache_size_per_layer_bf16():
    from attnlab.kv_cache import LayerKVCache, kv_cache_bytes
    size = kv_cache_bytes(1, 1, 2048, 1024, batch=16, bytes_per_element=2)
    with torch.device("meta"):
        buffers = LayerKVCache(16, 16, 1024, 128, dtype=torch.bfloat16)   # 16 heads of 128 = 2,048
    assert size == sum(t.numel() * t.element_size() for t in (buffers.k, buffers.v))
    accepts("05-cache-size-per-layer-bf16", size / MiB)


def test_05_hybrid_cache_ratio():
    from attnlab.kv_cache import CacheSpec
    dense = CacheSpec("dense", 48, 32, 128, 32)
    hybrid = CacheSpec("hybrid", 48 // 6, 8, 128, 32)
    accepts("05-hybrid-cache-ratio", dense.bytes(4096) / hybrid.bytes(4096))


def test_05_gqa_cache_and_flops():
    from attnlab.attention import scaled_dot_product_attention
    from attnlab.kv_cache import kv_cache_bytes
    assert kv_cache_bytes(32, 32, 128, 4096) / kv_cache_bytes(32, 8, 128, 4096) == 4
    q = torch.randn(1, 32, 64, 16)
    counts = {h_kv: flops(lambda: scaled_dot_product_attention(q, *(torch.randn(1, h_kv, 64, 16) for _ in "kv")))
              for h_kv in (32, 8)}
    assert counts[32] == counts[8] > 0
    assert correct_option("05-gqa-cache-and-flops").startswith(
        "The cache shrinks 4×; the score and weighted-sum FLOPs (QKᵀ, AV) per token stay the same")


def test_05_repeat_kv_copy_mqa():
    from attnlab.attention import repeat_kv
    h, h_kv, t, d = 16, 1, 2048, 64
    cached = torch.zeros(1, h_kv, t, d)
    copied = repeat_kv(cached, h // h_kv)
    assert copied.untyped_storage().data_ptr() != cached.untyped_storage().data_ptr()   # a copy, not a view
    accepts("05-repeat-kv-copy-mqa", copied.numel() / 2**20)
    accepts("05-repeat-kv-copy-mqa", copied.numel() / 1e6)      # millions also accepted
