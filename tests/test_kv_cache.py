"""KVCache (preallocated, per layer, GQA-aware) and the KV-cache memory formulas against known values."""
import pytest
import torch

from attnlab.attention import MultiHeadAttention
from attnlab.kv_cache import (
    PRESETS, CacheSpec, KVCache, LayerKVCache, kv_cache_bytes, mla_cache_bytes, variants,
)
from attnlab.numerics import agrees

GiB = 2**30


def test_cache_is_preallocated_and_appends_in_place():
    cache = LayerKVCache(2, 3, 10, 4)
    buffer = cache.k.data_ptr()
    k1, v1 = torch.randn(2, 2, 3, 4, 4)
    k, v = cache.append(k1, v1)
    assert k.shape == (2, 3, 4, 4) and torch.equal(k, k1) and torch.equal(v, v1)
    k2, v2 = torch.randn(2, 2, 3, 1, 4)
    k, v = cache.append(k2, v2)
    assert cache.length == 5 and torch.equal(k, torch.cat([k1, k2], dim=2)) and torch.equal(v, torch.cat([v1, v2], 2))
    assert k.data_ptr() == buffer and cache.k.shape == (2, 3, 10, 4)


def test_full_cache_raises_a_clear_error_and_keeps_its_contents():
    cache = LayerKVCache(1, 1, 4, 2)
    cache.append(torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))
    with pytest.raises(ValueError, match=r"KV cache is full: it holds 3 of max_len=4 positions and cannot take 2 more"):
        cache.append(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    assert cache.length == 3 and cache.k[0, 0, :3].eq(1).all()


def test_append_checks_shapes():
    cache = LayerKVCache(2, 2, 8, 4)
    with pytest.raises(ValueError, match=r"k must have shape \(b=2, h_kv=2, n, d=4\).*got \(2, 4, 1, 4\)"):
        cache.append(torch.zeros(2, 4, 1, 4), torch.zeros(2, 4, 1, 4))
    with pytest.raises(ValueError, match="same shape"):
        cache.append(torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 2, 4))
    with pytest.raises(ValueError, match="max_len must be a positive integer"):
        LayerKVCache(1, 1, 0, 4)


def test_truncate_rolls_back_and_the_next_append_overwrites():
    cache = KVCache(2, 1, 1, 6, 2)
    for layer in cache.layers:
        layer.append(torch.ones(1, 1, 4, 2), torch.ones(1, 1, 4, 2))
    cache.truncate(2)
    assert cache.length == 2
    k, _ = cache[0].append(torch.full((1, 1, 1, 2), 5.0), torch.zeros(1, 1, 1, 2))
    assert k.shape[2] == 3 and k[0, 0, 2].eq(5).all()
    with pytest.raises(ValueError, match="between 0 and the cached length"):
        cache.truncate(4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_allocated_bytes_equal_the_formula(dtype):
    cache = KVCache(3, 2, 2, 50, 8, dtype=dtype)
    size = torch.tensor([], dtype=dtype).element_size()
    assert cache.nbytes() == kv_cache_bytes(3, 2, 8, 50, batch=2, bytes_per_element=size)


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
def test_mha_with_cache_equals_mha_on_the_whole_sequence(heads):
    """Token-by-token attention through a cache equals causal attention over the whole sequence."""
    h, h_kv = heads
    torch.manual_seed(0)
    mha = MultiHeadAttention(24, h, h_kv)
    x = torch.randn(2, 11, 24)
    full = mha(x, causal=True)
    exact = mha.double()(x.double(), causal=True)
    mha.float()
    cache = LayerKVCache(2, h_kv, 11, 24 // h)
    assert cache.k.shape[1] == h_kv  # only the key/value heads are stored
    steps = torch.cat([mha(x[:, t:t + 1], causal=True, cache=cache) for t in range(11)], dim=1)
    assert agrees(steps, full, exact, scale=exact.abs().max().item())


def test_mha_cache_argument_errors():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="cache is for self-attention"):
        mha(x, context=x, cache=LayerKVCache(1, 2, 8, 4))
    with pytest.raises(ValueError, match="cache has 2 layers"):
        mha(x, cache=KVCache(2, 1, 2, 8, 4))
    with pytest.raises(TypeError, match="cache must be a LayerKVCache or KVCache, got dict"):
        mha(x, cache={})
    mha(x, cache=KVCache(1, 1, 2, 8, 4))  # a one-layer KVCache is accepted


def test_llama2_7b_at_4096_tokens_fp16_is_2_gib():
    assert kv_cache_bytes(32, 32, 128, 4096) == 2 * GiB
    assert PRESETS["Llama-2-7B"].bytes(4096) == 2 * GiB


@pytest.mark.parametrize("name, gib", [("Llama-2-7B", 128), ("Mixtral-8x7B", 32), ("Jamba-v0.1", 4)])
def test_256k_tokens_match_the_jamba_paper_table(name, gib):
    assert PRESETS[name].bytes(256 * 1024) == gib * GiB


def test_other_presets():
    assert PRESETS["Llama-3-8B"].bytes(8192) == 1 * GiB
    mistral = PRESETS["Mistral-7B"]
    assert mistral.label == "Mistral-7B v0.1" and PRESETS["Llama-2-7B"].label == "Llama-2-7B"
    assert mistral.bytes(4096) == PRESETS["Llama-3-8B"].bytes(4096)
    assert mistral.bytes(32 * 1024) == mistral.bytes(4096)  # the rolling buffer stops growing at w
    assert kv_cache_bytes(32, 8, 128, 32 * 1024) / mistral.bytes(32 * 1024) == 8  # the paper's 8x at 32k
    deepseek = PRESETS["DeepSeek-V2"]
    assert deepseek.bytes(1) == 60 * 576 * 2  # (d_c + d_h^R) l elements per token
    mha_equivalent = kv_cache_bytes(60, 128, 128, 1)
    assert mha_equivalent / deepseek.bytes(1) == pytest.approx(2 * 128 / 4.5)  # "GQA with 2.25 groups"


def test_the_lectures_500_mb_is_512_mib_in_fp32():
    """N = 2048, batch 32, d_model = 1024, one layer: 2 · 2048 · 32 · 1024 values."""
    assert kv_cache_bytes(1, 8, 128, 2048, batch=32, bytes_per_element=4) == 512 * 2**20
    assert kv_cache_bytes(1, 8, 128, 2048, batch=32, bytes_per_element=2) == 256 * 2**20


def test_variants_order_and_ratios():
    v = variants()
    names = list(v)
    assert [spec.variant for spec in v.values()] == ["MHA", "GQA", "MQA", "MLA", "MHA + window 4096"]
    mha = v[names[0]].bytes(32768)
    assert mha / v[names[1]].bytes(32768) == 4
    assert mha / v[names[2]].bytes(32768) == 32
    assert v[names[3]].bytes(32768) == mla_cache_bytes(32, 512, 64, 32768)
    assert v[names[4]].bytes(32768) == mha / 8


def test_kv_cache_bytes_rejects_negative_sizes():
    with pytest.raises(ValueError, match="seq_len must be non-negative, got -1"):
        kv_cache_bytes(1, 1, 1, -1)


def test_cache_spec_variant_names():
    assert CacheSpec("x", 1, 1, 8, 4).variant == "MQA"
    assert CacheSpec("x", 1, 2, 8, 4, window=16).variant == "GQA + window 16"


def test_uncached_decode_flops_equal_summed_block_flops():
    from attnlab.blocks import block_flops
    from attnlab.kv_cache import decode_flops

    total = sum(block_flops(t, 32)["total"] for t in range(5, 5 + 20))
    assert decode_flops(5, 20, 32, cached=False)["total"] == total
    assert decode_flops(5, 1, 32, cached=True) == decode_flops(5, 1, 32, cached=False)  # one step: the prefill


def test_decode_attention_flops_grow_as_n_cubed_without_a_cache_and_n_squared_with():
    from attnlab.bench import loglog_slope
    from attnlab.kv_cache import decode_flops

    ns = [256, 512, 1024, 2048]
    uncached = [decode_flops(1, n, 64, cached=False)["attention"] for n in ns]
    cached = [decode_flops(1, n, 64, cached=True)["attention"] for n in ns]
    assert loglog_slope(ns, uncached) == pytest.approx(3, abs=0.02)
    assert loglog_slope(ns, cached) == pytest.approx(2, abs=0.02)


def test_live_explorer_builds():
    from attnlab.widgets import kv_cache_explorer

    box = kv_cache_explorer()
    assert len(box.children) == 2


# --------------------------------------------------------------------------- cross-attention's cache

@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
def test_cross_attention_with_context_kv_equals_recomputing(heads):
    """Keys and values of a fixed context computed once give what recomputing them every step gives."""
    h, h_kv = heads
    torch.manual_seed(1)
    mha = MultiHeadAttention(32, h, h_kv).eval()
    context, steps = torch.randn(2, 9, 32), torch.randn(5, 2, 1, 32)
    k, v = mha.context_kv(context)
    assert k.shape == v.shape == (2, h_kv, 9, 32 // h)
    for x in steps:
        assert torch.equal(mha(x, context_kv=(k, v)), mha(x, context=context))
        out, weights = mha(x, context_kv=(k, v), return_weights=True)
        assert weights.shape == (2, h, 1, 9)


def test_context_kv_argument_errors():
    mha = MultiHeadAttention(8, 2)
    x, context = torch.randn(1, 3, 8), torch.randn(1, 5, 8)
    kv = mha.context_kv(context)
    with pytest.raises(ValueError, match=r"cache is for self-attention; .*context_kv\(context\)"):
        mha(x, context_kv=kv, cache=LayerKVCache(1, 2, 8, 4))
    with pytest.raises(ValueError, match="not both"):
        mha(x, context=context, context_kv=kv)
    with pytest.raises(TypeError, match="context_kv must be a pair of tensors"):
        mha(x, context_kv=kv[0])
    with pytest.raises(ValueError, match=r"context_kv's k must have shape \(b, h_kv, m, d\) = \(2, 2, 5, 4\)"):
        mha(torch.randn(2, 3, 8), context_kv=kv)
    with pytest.raises(ValueError, match="context must have shape"):
        mha.context_kv(torch.randn(5, 8))


# --------------------------------------------------------------------------- the decoding-speed command

def test_timed_decode_writes_generates_ids_in_every_form():
    from attnlab.experiments import decode_speed
    from attnlab.models import GPTConfig, generate
    model = decode_speed.chapter_model(GPTConfig(vocab_size=32, max_len=40, n_layers=2, d_model=32, n_heads=4))
    prompt = decode_speed.chapter_prompt(6, vocab=32)
    runs = [decode_speed.timed_decode(model, prompt, 20, cached=c, fused=f) for c in (True, False) for f in (False, True)]
    for ids, seconds, cpu in runs:
        assert torch.equal(ids, generate(model, prompt, 20, greedy=True))
        assert len(seconds) == len(cpu) == 20 and min(seconds) > 0


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_fused_forward_equals_the_library_forward(n_kv_heads):
    from attnlab.experiments import decode_speed
    from attnlab.models import GPTConfig
    config = GPTConfig(vocab_size=32, max_len=40, n_layers=2, d_model=32, n_heads=4)
    model = decode_speed.chapter_model(config, n_kv_heads=n_kv_heads)
    assert model.blocks[0].attn.n_kv_heads == n_kv_heads
    ids = torch.randint(0, 32, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids)
        assert torch.allclose(decode_speed.fused_forward(model, ids), full[:, -1:], atol=1e-5)
        cache = model.new_cache(2, 30)                           # prefill, then one token per step
        steps = [decode_speed.fused_forward(model, ids[:, :10], cache)]
        steps += [decode_speed.fused_forward(model, ids[:, s:s + 1], cache) for s in range(10, 30)]
    assert torch.allclose(torch.cat(steps, dim=1), full[:, 9:], atol=1e-5)
    with pytest.raises(ValueError, match="empty cache"):
        decode_speed.fused_forward(model, ids[:, :2], cache)


def test_summary_rows_sum_the_first_steps():
    from attnlab.experiments.decode_speed import kv_head_rows, same_ids, summary_rows
    points = [{"form": "cached", "cpu_ms": [2.0, 1.0, 1.0], "ids": [1, 2]},
              {"form": "cached", "cpu_ms": [4.0, 1.0, 3.0], "ids": [1, 2]},
              {"form": "uncached", "cpu_ms": [3.0, 6.0, 9.0], "ids": [1, 2]}]
    (row,) = summary_rows(points, at=(2,))
    assert row["cached s"] == 4e-3 and row["uncached s"] == 9e-3 and row["speed-up"] == 9 / 4
    assert summary_rows(points, at=(5,)) == [] and "vs fused" not in row
    points.append({"form": "uncached, fused", "cpu_ms": [2.0, 2.0, 2.0], "ids": [1, 2]})
    assert summary_rows(points, at=(3,))[0]["vs fused"] == 6 / 6       # cached: medians 3 + 1 + 2 ms
    assert same_ids(points) and not same_ids(points + [{"form": "uncached", "ids": [1, 3]}])
    gqa = [{"form": f, "n_kv_heads": 1, "cpu_ms": [9.0, 1.0, 3.0], "ids": [4]} for f in ("cached", "cached, fused")]
    rows = kv_head_rows(points + gqa, at=3)
    assert rows[-1] == {"KV heads": 1, "cached ms/step": 2.0, "fused cached ms/step": 2.0}


def test_the_shipped_decoding_run_records_its_command_and_identical_ids():
    from attnlab.experiments import decode_speed
    run = decode_speed.load()
    assert run["command"].startswith("python -m attnlab.experiments.decode_speed") and run["threads"] == 1
    assert run["new_tokens"] == 1024 and run["config"]["max_len"] >= run["prompt_len"] + run["new_tokens"]
    forms = {(p["form"], p["n_kv_heads"]) for p in run["points"]}
    assert forms == {(f, 6) for f in decode_speed.FORMS} | {(f, h) for f in decode_speed.GQA_FORMS for h in (2, 1)}
    assert all(len(p["step_ms"]) == len(p["cpu_ms"]) == 1024 for p in run["points"])
    assert all(decode_speed.same_ids(run["points"], h) for h in decode_speed.KV_HEADS)
