"""MicroGPT and generate: the cached forms against the full forward pass (the reference form)."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from attnlab.blocks import count_parameters
from attnlab.kv_cache import KVCache
from attnlab.models import GPTConfig, MicroGPT, generate, sample_next
from attnlab.numerics import agrees


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=23, max_len=40, n_layers=2, d_model=24, n_heads=4)
    cfg.update(kw)
    return MicroGPT(GPTConfig(**cfg)).eval()


def _randomise(model, seed):
    """Large random weights, so that attention is far from uniform and a caching bug shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.1))
    return model


def test_logits_shape_is_b_l_v():
    model = _model(vocab_size=100, max_len=16, n_layers=1, d_model=32, n_heads=2, d_ff=128)
    assert model(torch.zeros(4, 16, dtype=torch.long)).shape == (4, 16, 100)


def test_weight_tying_shares_one_matrix_and_counts_it_once():
    tied, untied = _model(tie_weights=True), _model(tie_weights=False)
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert count_parameters(untied) - count_parameters(tied) == 23 * 24


def test_final_norm_is_optional():
    assert isinstance(_model(final_norm=False).norm_f, torch.nn.Identity)


def test_initial_loss_is_near_ln_vocab():
    model = _model(vocab_size=65, max_len=32)
    g = torch.Generator().manual_seed(0)
    idx, targets = torch.randint(0, 65, (2, 8, 32), generator=g)
    loss = F.cross_entropy(model(idx).reshape(-1, 65), targets.reshape(-1))
    assert abs(loss.item() - math.log(65)) < 0.05


def test_forward_equals_composing_the_library_blocks():
    """The written-out pre-LN steps equal TransformerBlock.forward with a causal mask."""
    model = _randomise(_model(dropout=0.0), 1)
    idx = torch.randint(0, 23, (2, 17), generator=torch.Generator().manual_seed(1))
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(17))
    for block in model.blocks:
        x = block(x, causal=True)
    reference = model.lm_head(model.norm_f(x))
    assert torch.allclose(model(idx), reference, atol=1e-5, rtol=0)


def test_is_causal_future_tokens_do_not_change_past_logits():
    model = _randomise(_model(), 2)
    idx = torch.randint(0, 23, (1, 20), generator=torch.Generator().manual_seed(2))
    changed = idx.clone()
    changed[0, 12:] = (changed[0, 12:] + 1) % 23
    assert torch.allclose(model(idx)[:, :12], model(changed)[:, :12], atol=1e-6)


def test_return_weights_are_causal_distributions():
    model = _model()
    logits, weights = model(torch.randint(0, 23, (2, 9)), return_weights=True)
    assert len(weights) == 2 and weights[0].shape == (2, 4, 9, 9)
    assert torch.allclose(weights[1].sum(-1), torch.ones(2, 4, 9))
    assert (weights[0].triu(1) == 0).all()


@given(st.integers(1, 3), st.sampled_from([(4, 4), (4, 2), (4, 1)]), st.lists(st.integers(1, 7), min_size=1, max_size=5),
       st.integers(0, 1000))
@settings(max_examples=25)
def test_cached_forward_in_chunks_equals_full_forward(batch, heads, chunks, seed):
    """Feeding the sequence chunk by chunk through a KV cache gives the full forward's logits (MHA, GQA, MQA)."""
    h, h_kv = heads
    model = _randomise(_model(n_heads=h, n_kv_heads=h_kv), seed)
    length = sum(chunks)
    idx = torch.randint(0, 23, (batch, length), generator=torch.Generator().manual_seed(seed))
    full = model(idx)
    exact = _model(n_heads=h, n_kv_heads=h_kv).double()
    exact.load_state_dict(model.state_dict())
    reference = exact(idx)
    cache = model.new_cache(batch, length)
    pieces, start = [], 0
    for n in chunks:
        pieces.append(model(idx[:, start:start + n], cache=cache))
        start += n
    cached = torch.cat(pieces, dim=1)
    assert cache.length == length
    assert agrees(cached, full, reference, scale=reference.abs().max().item())


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
def test_cached_and_uncached_greedy_generation_give_identical_ids(heads):
    model = _randomise(_model(n_heads=heads[0], n_kv_heads=heads[1]), 3)
    prompt = torch.randint(0, 23, (3, 5), generator=torch.Generator().manual_seed(3))
    cached = generate(model, prompt, 30, use_cache=True, greedy=True)
    uncached = generate(model, prompt, 30, use_cache=False, greedy=True)
    assert cached.shape == (3, 35)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached[:, :5], prompt)


def test_sampling_with_the_same_generator_is_reproducible_and_cache_independent():
    model = _model()
    prompt = torch.zeros(2, 1, dtype=torch.long)
    runs = [generate(model, prompt, 20, use_cache=c, temperature=0.8, top_k=5,
                     generator=torch.Generator().manual_seed(7)) for c in (True, False, True)]
    assert torch.equal(runs[0], runs[2]) and torch.equal(runs[0], runs[1])


def test_top_k_one_is_greedy():
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample_next(logits, top_k=1), sample_next(logits, greedy=True))


def test_generate_restores_training_mode():
    model = _model().train()
    generate(model, torch.zeros(1, 1, dtype=torch.long), 3)
    assert model.training


def test_generate_without_cache_crops_to_max_len():
    model = _model(max_len=8)
    out = generate(model, torch.zeros(1, 4, dtype=torch.long), 10, use_cache=False, greedy=True)
    assert out.shape == (1, 14)
    with pytest.raises(ValueError, match="max_len=8"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), 10, use_cache=True)


def test_bad_inputs_name_the_argument_and_shape():
    model = _model()
    with pytest.raises(ValueError, match=r"idx must be an integer tensor of shape \(b, L\), got \(5,\)"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="exceed max_len=40"):
        model(torch.zeros(1, 41, dtype=torch.long))
    with pytest.raises(ValueError, match="cache has 1 layers, the model 2"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=KVCache(1, 1, 4, 40, 6))
    with pytest.raises(TypeError, match="GPTConfig"):
        MicroGPT({"vocab_size": 3})
    with pytest.raises(ValueError, match="temperature"):
        sample_next(torch.zeros(1, 3), temperature=0)


def test_cache_positions_continue_where_the_cache_ends():
    model = _model(max_len=10)
    cache = model.new_cache(1)
    model(torch.zeros(1, 7, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="positions 7..10 exceed max_len=10"):
        model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
