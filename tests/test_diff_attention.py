"""Differential attention: the λ schedule, the two-map formula, the module, and the retrieval task."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

from attnlab.attention import causal_mask, scaled_dot_product_attention
from attnlab.blocks import count_parameters
from attnlab.diff_attention import (
    DifferentialAttention, RetrievalModel, attention_on_target, differential_attention, lambda_init,
    reparameterised_lambda,
)
from attnlab.tasks import key_value_retrieval


def test_lambda_init_schedule():
    assert lambda_init(1) == pytest.approx(0.2)
    assert lambda_init(2) == pytest.approx(0.8 - 0.6 * math.exp(-0.3))
    values = [lambda_init(l) for l in range(1, 40)]
    assert all(a < b for a, b in zip(values, values[1:])) and values[-1] == pytest.approx(0.8, abs=1e-4)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="counted from 1"):
            lambda_init(bad)


def test_reparameterised_lambda():
    z = torch.zeros(8)
    assert reparameterised_lambda(z, z, z, z, 0.3).item() == pytest.approx(0.3)
    g = torch.Generator().manual_seed(0)
    a, b, c, d = (torch.randn(8, generator=g, dtype=torch.float64) for _ in range(4))
    assert reparameterised_lambda(a, b, c, d, 0.2).item() == pytest.approx(
        math.exp(a @ b) - math.exp(c @ d) + 0.2, rel=1e-12)
    with pytest.raises(ValueError, match="lk2 must have shape"):
        reparameterised_lambda(z, z, z, torch.zeros(3), 0.2)


@given(b=st.integers(1, 2), h=st.integers(1, 3), n=st.integers(1, 9), m=st.integers(1, 9),
       d=st.sampled_from([1, 3, 8]), lam=st.floats(-1.0, 1.0), causal=st.booleans())
def test_differential_equals_two_torch_maps(b, h, n, m, d, lam, causal):
    g = torch.Generator().manual_seed(n * 100 + m)
    q1, q2 = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(2))
    k1, k2 = (torch.randn(b, h, m, d, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(b, h, m, 2 * d, generator=g, dtype=torch.float64)
    mask = causal_mask(n, m) if causal else None
    out, weights = differential_attention(q1, k1, q2, k2, v, lam, causal=causal, return_weights=True)
    if causal and n > m:           # torch gives NaN on fully masked rows; ours gives zeros
        return
    ref = (F.scaled_dot_product_attention(q1, k1, v, attn_mask=mask)
           - lam * F.scaled_dot_product_attention(q2, k2, v, attn_mask=mask))
    assert torch.allclose(out, ref, atol=1e-12)
    assert torch.allclose(weights.sum(-1), torch.full_like(weights[..., 0], 1 - lam), atol=1e-12)


def test_lambda_zero_is_standard_attention():
    g = torch.Generator().manual_seed(1)
    q1, k1, q2, k2 = (torch.randn(2, 3, 7, 5, generator=g) for _ in range(4))
    v = torch.randn(2, 3, 7, 10, generator=g)
    out, weights = differential_attention(q1, k1, q2, k2, v, 0.0, causal=True, return_weights=True)
    ref, ref_weights = scaled_dot_product_attention(q1, k1, v, causal=True, return_weights=True)
    assert torch.equal(out, ref) and torch.equal(weights, ref_weights)
    with pytest.raises(ValueError, match="q2 must match q1"):
        differential_attention(q1, k1, q2[:, :2], k2, v, 0.5)


def _layer(layer=1, d_model=24, n_heads=3, seed=0):
    torch.manual_seed(seed)
    return DifferentialAttention(d_model, n_heads, layer=layer).double()


def test_module_shapes_parameters_and_errors():
    attn = _layer()
    x = torch.randn(2, 5, 24, dtype=torch.float64)
    y, weights = attn(x, causal=True, return_weights=True)
    assert y.shape == (2, 5, 24) and weights.shape == (2, 3, 5, 5)
    assert attn.head_dim == 4 and attn.lambda_init == pytest.approx(0.2)
    assert count_parameters(attn) == 4 * 24 ** 2 + 4 * 4 + 2 * 4      # W^Q,K,V,O + four λ vectors + norm gain
    with pytest.raises(ValueError, match="divisible by 2"):
        DifferentialAttention(24, 5)
    with pytest.raises(ValueError, match=r"x must have shape \(b, L, d_model=24\)"):
        attn(torch.randn(2, 5, 23, dtype=torch.float64))


def test_module_equals_written_out_reference():
    attn = _layer(layer=3)
    x = torch.randn(2, 6, 24, dtype=torch.float64)
    b, L, h, d = 2, 6, 3, 4
    q = attn.q_proj(x).view(b, L, h, 2, d)
    k = attn.k_proj(x).view(b, L, h, 2, d)
    v = attn.v_proj(x).view(b, L, h, 2 * d).transpose(1, 2)
    lam = (torch.exp(attn.lambda_q1 @ attn.lambda_k1) - torch.exp(attn.lambda_q2 @ attn.lambda_k2)
           + 0.8 - 0.6 * math.exp(-0.6))
    mask = causal_mask(L)
    maps = [F.scaled_dot_product_attention(q[:, :, :, i].transpose(1, 2), k[:, :, :, i].transpose(1, 2), v,
                                           attn_mask=mask) for i in (0, 1)]
    heads = (1 - attn.lambda_init) * F.rms_norm(maps[0] - lam * maps[1], (2 * d,), attn.head_norm.weight, eps=1e-5)
    ref = attn.out_proj(heads.transpose(1, 2).reshape(b, L, h * 2 * d))
    assert torch.allclose(attn(x, causal=True), ref, atol=1e-12)


def test_module_is_causal():
    attn = _layer()
    x = torch.randn(1, 8, 24, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 5:] = torch.randn(1, 3, 24, dtype=torch.float64)
    assert torch.allclose(attn(x, causal=True)[:, :5], attn(x2, causal=True)[:, :5], atol=1e-12)
    assert not torch.allclose(attn(x, causal=True)[:, 5:], attn(x2, causal=True)[:, 5:])


def test_heads_have_rms_one_minus_lambda_init():
    attn = _layer(layer=4)
    heads = attn.heads(torch.randn(3, 7, 24, dtype=torch.float64), causal=True)
    rms = heads.square().mean(-1).sqrt()
    assert torch.allclose(rms, torch.full_like(rms, 1 - lambda_init(4)), atol=1e-3)  # up to the norm's ε = 1e-5


def test_module_with_lambda_zero_reduces_to_first_map():
    attn = _layer(layer=2)
    with torch.no_grad():                       # λ = e^0 - e^{log(1 + λ_init)} + λ_init = 0
        attn.lambda_q1.zero_()
        attn.lambda_k1.zero_()
        attn.lambda_q2.fill_(0.0)
        attn.lambda_q2[0] = 1.0
        attn.lambda_k2.zero_()
        attn.lambda_k2[0] = math.log(1 + attn.lambda_init)
    assert abs(attn.lam().item()) < 1e-12
    x = torch.randn(2, 5, 24, dtype=torch.float64)
    q = attn.q_proj(x).view(2, 5, 3, 2, 4)[:, :, :, 0].transpose(1, 2)
    k = attn.k_proj(x).view(2, 5, 3, 2, 4)[:, :, :, 0].transpose(1, 2)
    v = attn.v_proj(x).view(2, 5, 3, 8).transpose(1, 2)
    standard = scaled_dot_product_attention(q, k, v, causal=True)
    expected = (1 - attn.lambda_init) * F.rms_norm(standard, (8,), eps=1e-5)
    assert torch.allclose(attn.heads(x, causal=True), expected, atol=1e-12)


def test_attention_on_target():
    one_hot = torch.zeros(2, 1, 6)
    one_hot[0, 0, 2] = one_hot[1, 0, 4] = 1.0
    share, ent = attention_on_target(one_hot, torch.tensor([2, 4]))
    assert torch.equal(share, torch.ones(2, 1)) and torch.equal(ent, torch.zeros(2, 1))
    share, ent = attention_on_target(torch.full((1, 2, 8), 1 / 8), torch.tensor([0]))
    assert torch.allclose(share, torch.full((1, 2), 1 / 8)) and torch.allclose(ent, torch.full((1, 2), math.log(8)))
    diff = torch.tensor([[[0.9, -0.1, 0.0, 0.0]]])                  # a differential row: |a| normalised
    share, _ = attention_on_target(diff, torch.tensor([0]))
    assert share.item() == pytest.approx(0.9)
    with pytest.raises(ValueError, match="weights must be"):
        attention_on_target(diff[0], torch.tensor([0]))


def test_retrieval_task_and_model():
    prompts = key_value_retrieval(16, 10, n_keys=20, n_values=7, seed=3)
    assert prompts.tokens.shape == (16, 11) and prompts.vocab == 20 * 7 + 20
    rows = torch.arange(16)
    stored = prompts.tokens[rows, prompts.position]
    assert torch.equal(stored // 7, prompts.tokens[:, -1] - 140)   # the query's key sits at `position`
    assert torch.equal(stored % 7, prompts.targets)
    keys = prompts.tokens[:, :-1] // 7
    assert all(len(set(row.tolist())) == 10 for row in keys)          # distinct keys: one right answer
    with pytest.raises(ValueError, match="n_pairs must be between"):
        key_value_retrieval(2, 30, n_keys=20)
    for kind in ("standard", "differential"):
        model = RetrievalModel(20, 7, d_model=32, n_heads=2, attention=kind)
        logits, weights = model(prompts.tokens, return_weights=True)
        assert logits.shape == (16, 7) and weights.shape == (16, 4 if kind == "standard" else 2, 11)
    assert count_parameters(RetrievalModel(20, 7, 32, 2, "standard").attn) + 6 * 8 == \
        count_parameters(RetrievalModel(20, 7, 32, 2, "differential").attn)


def test_near_duplicate_retrieval_holds_whole_groups():
    prompts = key_value_retrieval(32, 16, n_keys=64, n_values=5, seed=4, group_size=8)
    keys = prompts.tokens[:, :-1] // 5
    for row, pos in zip(keys, prompts.position):
        assert len(set(row.tolist())) == 16                              # distinct keys
        groups = (row // 8).tolist()
        assert all(groups.count(g) == 8 for g in set(groups))            # two whole groups of 8
        assert groups.count(groups[pos]) - 1 == 7                        # 7 near-duplicates of the target
    stored = prompts.tokens[torch.arange(32), prompts.position]
    assert torch.equal(stored // 5, prompts.tokens[:, -1] - 64 * 5) and torch.equal(stored % 5, prompts.targets)
    plain = key_value_retrieval(8, 10, seed=1)
    assert torch.equal(plain.tokens, key_value_retrieval(8, 10, seed=1, group_size=1).tokens)
    with pytest.raises(ValueError, match="group_size"):
        key_value_retrieval(2, 12, n_keys=64, group_size=8)


def test_grouped_embedding_shares_the_group_part():
    model = RetrievalModel(64, 5, d_model=16, n_heads=2, attention="differential", group_size=8)
    # keys 8 and 9 (group 1) with value 0, key 16 (group 2) with value 0
    tokens = torch.tensor([[8 * 5, 9 * 5, 16 * 5, 64 * 5 + 8]])
    x = model.embed(tokens)[0]
    group1, group2 = model.key_group.weight[1], model.key_group.weight[2]
    assert torch.allclose(x[0] - model.key_embed.weight[0] - model.value_embed.weight[0], group1)
    assert torch.allclose(x[1] - model.key_embed.weight[1] - model.value_embed.weight[0], group1)
    assert torch.allclose(x[2] - model.key_embed.weight[0] - model.value_embed.weight[0], group2)
    assert torch.allclose(x[3], model.query_group.weight[1] + model.query_embed.weight[0])
    assert model(tokens).shape == (1, 5)


def test_lambda_modes():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    zero = DifferentialAttention(32, 2, lambda_mode="zero").double()
    assert zero.lam().item() == 0.0
    _, weights = zero(x, causal=True, return_weights=True)
    q, k = zero.q_proj(x).view(2, 6, 2, 2, 8), zero.k_proj(x).view(2, 6, 2, 2, 8)
    scores = torch.einsum("bihd,bjhd->bhij", q[:, :, :, 0], k[:, :, :, 0]) / math.sqrt(8)
    first_map = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), -math.inf).softmax(-1)
    assert torch.allclose(weights, first_map)                           # λ = 0: the first map alone
    fixed = DifferentialAttention(32, 2, layer=3, lambda_mode="fixed")
    assert fixed.lam().item() == pytest.approx(lambda_init(3))
    assert not any(p.requires_grad for p in (fixed.lambda_q1, fixed.lambda_k1, fixed.lambda_q2, fixed.lambda_k2))
    learned = DifferentialAttention(32, 2)
    assert learned.lambda_q1.requires_grad and learned.lam().item() != lambda_init(1)
    model = RetrievalModel(20, 7, 32, 2, "standard", standard_heads=2)
    assert model.attn.n_heads == 2
