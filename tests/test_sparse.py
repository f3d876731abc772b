"""Sparse patterns count what they should; the sliding-window kernel equals masked dense attention."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

from attnlab.attention import scaled_dot_product_attention
from attnlab.numerics import agrees, error_ratio
from attnlab.sparse import (
    bigbird_mask, block_sparse_mask, density, dilated_window_mask, global_mask, keys_per_row, longformer_mask,
    receptive_field, sliding_window_attention, sliding_window_mask, strided_mask,
)


def test_window_counts():
    n, w = 64, 5
    assert keys_per_row(sliding_window_mask(n, w))[w:-w].eq(2 * w + 1).all()
    assert keys_per_row(sliding_window_mask(n, w, causal=True))[w:].eq(w + 1).all()
    mask = longformer_mask(n, w, global_tokens=[0, 1])
    assert keys_per_row(mask)[10:-10].eq(2 * w + 1 + 2).all()            # 2w + 1 + g, not 2w + g
    assert keys_per_row(mask)[0] == n and density(sliding_window_mask(n, n)) == 1.0


def test_other_patterns():
    n = 32
    assert torch.equal(dilated_window_mask(n, 2, 3)[10].nonzero().flatten(), torch.tensor([4, 7, 10, 13, 16]))
    s = strided_mask(n, 4)
    assert s[10].nonzero().flatten().tolist() == [2, 6, 7, 8, 9, 10]
    assert not s.triu(1).any()
    bb = bigbird_mask(n, 2, 1, 3, seed=0)
    assert (keys_per_row(bb)[5:-5] >= 2 * 2 + 1 + 1 + 3).all()
    assert torch.equal(bigbird_mask(n, 2, 1, 3, seed=0), bb)
    layout = torch.eye(4, dtype=torch.bool)
    assert density(block_sparse_mask(n, 8, layout)) == 0.25
    with pytest.raises(ValueError, match="layout must have shape"):
        block_sparse_mask(n, 8, torch.eye(3))
    with pytest.raises(ValueError, match="global_tokens must lie"):
        global_mask(4, [5])


def test_receptive_field_grows_linearly_with_window_and_jumps_with_globals():
    n, w = 101, 3
    field = receptive_field(sliding_window_mask(n, w), 5)
    assert torch.all(field[1:] > field[:-1]) and field[-1] < 1
    assert field[0] == pytest.approx(density(sliding_window_mask(n, w)))          # one layer: the mask itself
    assert torch.isclose(receptive_field(longformer_mask(n, w, [0]), 2)[-1], torch.tensor(1.0))


@given(st.integers(1, 60), st.integers(0, 12), st.booleans(), st.integers(0, 999), st.integers(1, 16))
def test_sliding_window_equals_masked_dense(n, window, causal, seed, block):
    # block ≤ 16 < n for most draws: several query blocks, windows crossing block edges
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for _ in range(3))
    mask = sliding_window_mask(n, window, causal=causal)
    ours = sliding_window_attention(q, k, v, window, causal=causal, block=block)
    exact = scaled_dot_product_attention(q.double(), k.double(), v.double(), mask)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert agrees(ours, theirs, exact, scale=v.abs().max().item()), error_ratio(ours, theirs, exact)


def test_sliding_window_rejects_bad_input():
    q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match="window must be a non-negative int, got -1"):
        sliding_window_attention(q, q, q, -1)
    with pytest.raises(ValueError, match="same shape"):
        sliding_window_attention(q, q[:, :, :4], q[:, :, :4], 1)


@given(st.integers(1, 200), st.integers(1, 40), st.integers(0, 60), st.booleans())
def test_window_tiles_counts_the_non_empty_tiles_of_the_mask(n, block, window, causal):
    from attnlab.sparse import tile_classes, window_tiles
    classes = tile_classes(sliding_window_mask(n, window, causal=causal), block)
    assert window_tiles(n, block, window, causal=causal) == int((classes > 0).sum())


def test_tile_classes_by_brute_force_and_the_dense_counts():
    from attnlab.sparse import tile_classes, window_tiles
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(23, 23, generator=g) < 0.1
    mask[:8, :8] = True                                  # one full tile
    classes = tile_classes(mask, 8)
    for i in range(3):
        for j in range(3):
            tile = mask[8 * i:8 * i + 8, 8 * j:8 * j + 8]
            assert classes[i, j] == (2 if tile.all() else 1 if tile.any() else 0)
    assert classes[0, 0] == 2
    assert window_tiles(1024, 128, 1024, causal=True) == 36      # causal dense: T(T + 1)/2
    assert window_tiles(1024, 128, 1024) == 64                   # dense: T²
    assert window_tiles(4096, 128, 128) == 3 * 32 - 2
    with pytest.raises(ValueError, match="block must be a positive int"):
        tile_classes(mask, 0)
