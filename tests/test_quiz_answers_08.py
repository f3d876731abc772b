"""Transfer questions of chapter 08: each answer computed with attnlab (see test_quiz_answers.py)."""
import math

import torch

from quiz_checks import accepts


# --------------------------------------------------------------------------- 08 sparse attention

def _concept_option(qid: str) -> str:
    """The correct option of a concept question (checked here by computation, not accepts)."""
    from attnlab.quiz import find_question
    q = find_question(qid)
    assert q["kind"] == "concept", qid
    (text,) = [a["answer"] for a in q["answers"] if a["correct"]]
    return text


def test_08_window_global_key_count():
    from attnlab.sparse import keys_per_row, longformer_mask
    keys = keys_per_row(longformer_mask(512, 40, global_tokens=range(5)))
    accepts("08-window-global-key-count", keys[256].item())     # an ordinary query, far from the edges


def test_08_causal_longformer_keys():
    from attnlab.sparse import keys_per_row, longformer_mask
    mask = longformer_mask(4096, 100, global_tokens=(0, 1, 2), causal=True)
    accepts("08-causal-longformer-keys", keys_per_row(mask)[2000].item())


def test_08_causal_tiles_n3000_b128():
    from attnlab.sparse import tile_classes, window_tiles
    from attnlab.attention import causal_mask
    tiles = int((tile_classes(causal_mask(3000), 128) > 0).sum())
    assert tiles == window_tiles(3000, 128, 3000, causal=True)
    accepts("08-causal-tiles-n3000-b128", tiles)


def test_08_window_tiles_n4096():
    from attnlab.sparse import sliding_window_mask, tile_classes, window_tiles
    counted = window_tiles(4096, 128, 128)
    assert counted == int((tile_classes(sliding_window_mask(4096, 128), 128) > 0).sum())
    accepts("08-window-tiles-n4096", counted)


def test_08_layers_connect_all_pairs():
    from attnlab.sparse import reach, sliding_window_mask
    n, w = 1024, 8
    layers = reach(sliding_window_mask(n, w), 130)
    first = next(L for L, seen in enumerate(layers, 1) if bool(seen.all()))
    assert first == math.ceil((n - 1) / w)
    accepts("08-layers-connect-all-pairs", first)


def test_08_rolling_cache_slot():
    from attnlab.sparse import sliding_window_attention
    S, t = 4096, 10000
    slots = torch.full((S,), -1)
    for p in range(t + 1):                        # the rolling buffer, written in turn
        slots[p % S] = p
    (slot,) = (slots == t).nonzero().flatten().tolist()
    assert sorted(slots.tolist()) == list(range(t - S + 1, t + 1))   # exactly the window
    # the same buffer decodes the causal window exactly (a small case)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 12, 4, generator=g, dtype=torch.float64) for _ in range(3))
    keys, vals, out = torch.zeros(3, 4, dtype=torch.float64), torch.zeros(3, 4, dtype=torch.float64), []
    for p in range(12):
        keys[p % 3], vals[p % 3] = k[0, 0, p], v[0, 0, p]
        live = min(p + 1, 3)
        out.append(torch.softmax(keys[:live] @ q[0, 0, p] / 2, -1) @ vals[:live])
    assert torch.allclose(torch.stack(out), sliding_window_attention(q, k, v, 2, causal=True)[0, 0])
    accepts("08-rolling-cache-slot", slot)


def test_08_longformer_density_percent():
    from attnlab.sparse import density, longformer_mask
    accepts("08-longformer-density-percent", 100 * density(longformer_mask(4096, 128, (0, 1, 2, 3))))


def test_08_window_reach_layers():
    from attnlab.sparse import reach, sliding_window_mask
    n, w = 64, 4
    reached = reach(sliding_window_mask(n, w), 12)
    for d in (8, 12, 20):
        layers = next(l + 1 for l, r in enumerate(reached) if r[10 + d, 10] and r[10, 10 + d])
        assert layers == d // w
    assert _concept_option("08-window-reach-layers").startswith("About d / w layers")


def test_08_global_token_two_hops():
    from attnlab.sparse import longformer_mask, receptive_field, sliding_window_mask
    window_only = receptive_field(sliding_window_mask(64, 2), 2)
    with_global = receptive_field(longformer_mask(64, 2, global_tokens=(0,)), 2)
    assert window_only[-1] < 0.2 and with_global[-1] == 1.0
    assert _concept_option("08-global-token-two-hops").startswith("Every pair is connected within two layers")


def test_08_iid_error_prediction():
    from attnlab.attention import scaled_dot_product_attention
    from attnlab.sparse import sliding_window_attention
    n, w = 4096, 64
    predicted = math.sqrt((n - 2 * w - 1) / (2 * w + 1))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 64, generator=g) for _ in range(3))
    full = scaled_dot_product_attention(q, k, v)
    measured = ((sliding_window_attention(q, k, v, w) - full).norm() / full.norm()).item()
    assert abs(measured / predicted - 1) < 0.15, (measured, predicted)      # the formula holds here
    accepts("08-iid-error-prediction", predicted)
    accepts("08-iid-error-prediction", measured)


def test_08_mistral_cache_saving_128k():
    from attnlab.kv_cache import PRESETS, kv_cache_bytes
    spec = PRESETS["Mistral-7B"]
    n = 131_072
    full = kv_cache_bytes(spec.n_layers, spec.n_kv_heads, spec.head_dim, n)
    accepts("08-mistral-cache-saving-128k", full / spec.bytes(n))


def test_08_block_mask_partial_blocks():
    from attnlab.sparse import sliding_window_mask, tile_classes
    kinds = tile_classes(sliding_window_mask(1024, 200, causal=True), 128)   # the mask_mod's mask
    row = kinds[5]
    assert int((row == 2).sum()) == 0
    accepts("08-block-mask-partial-blocks", int((row == 1).sum()))
