"""scaled_dot_product_attention and MultiHeadAttention against torch's SDPA (the reference form)."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

from attnlab.attention import (
    MultiHeadAttention, attention_entropy, causal_mask, masked_softmax,
    scaled_dot_product_attention, softmax_jacobian,
)
from attnlab.numerics import agrees, error_ratio, max_abs_error


def _random(b, h, h_kv, n, m, d, d_v, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, n, d, generator=g), torch.randn(b, h_kv, m, d, generator=g),
            torch.randn(b, h_kv, m, d_v, generator=g))


def _check_against_torch(q, k, v, mask=None, causal=False, scale=None):
    """Ours (fp32) must be within 2x torch's fp32 error, both against our float64 result."""
    torch_mask = mask
    if causal:
        cm = causal_mask(q.shape[-2], k.shape[-2])
        torch_mask = cm if mask is None else (mask & cm if mask.dtype == torch.bool else mask.masked_fill(~cm, float("-inf")))
    ours = scaled_dot_product_attention(q, k, v, mask, causal=causal, scale=scale)
    exact = scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                         None if mask is None else (mask if mask.dtype == torch.bool else mask.double()),
                                         causal=causal, scale=scale)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=torch_mask, scale=scale,
                                            enable_gqa=q.shape[1] != k.shape[1])
    assert ours.shape == theirs.shape
    scale = v.abs().max().item()
    assert agrees(ours, theirs, exact, scale=scale), error_ratio(ours, theirs, exact, scale=scale)


shapes = st.tuples(
    st.integers(1, 2),            # b
    st.sampled_from([(1, 1), (4, 4), (4, 2), (6, 1), (8, 2)]),  # (h, h_kv): MHA, GQA, MQA
    st.integers(1, 40),           # n
    st.integers(1, 40),           # m
    st.sampled_from([1, 3, 8, 16, 33]),  # d
    st.sampled_from([1, 5, 16]),  # d_v
    st.integers(0, 10_000),       # seed
)


@given(shapes, st.booleans())
def test_agrees_with_torch_sdpa(shape, causal):
    b, (h, h_kv), n, m, d, d_v, seed = shape
    if causal and n > m:
        n = m  # bottom-right alignment with n > m leaves the first rows with no key at all
    _check_against_torch(*_random(b, h, h_kv, n, m, d, d_v, seed), causal=causal)


@given(shapes, st.sampled_from(["full", "row", "batch-head"]), st.booleans(), st.booleans())
def test_agrees_with_torch_sdpa_masked(shape, mask_shape, additive, causal):
    b, (h, h_kv), n, m, d, d_v, seed = shape
    g = torch.Generator().manual_seed(seed + 1)
    full = {"full": (n, m), "row": (1, m), "batch-head": (b, 1, n, m)}[mask_shape]
    keep = torch.rand(full, generator=g) > 0.3
    keep[..., -1] = True  # every query keeps at least its last key, so torch has no empty row
    mask = keep if not additive else torch.zeros(full).masked_fill(~keep, float("-inf"))
    _check_against_torch(*_random(b, h, h_kv, n, m, d, d_v, seed), mask=mask, causal=causal and n <= m)


def test_additive_finite_mask_and_custom_scale():
    q, k, v = _random(2, 4, 4, 7, 9, 16, 16, 0)
    bias = torch.randn(7, 9)
    _check_against_torch(q, k, v, mask=bias, scale=0.3)


def test_causal_mask_includes_diagonal_and_aligns_bottom_right():
    assert torch.equal(causal_mask(4), torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    m = causal_mask(2, 5)  # the last 2 of 5 positions
    assert m.tolist() == [[True, True, True, True, False], [True] * 5]


def test_fully_masked_row_gives_zeros_not_nan():
    q, k, v = _random(1, 2, 2, 3, 4, 8, 8, 1)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    out, w = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert not out.isnan().any()
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))
    assert torch.equal(w[:, :, 1], torch.zeros_like(w[:, :, 1]))
    assert torch.allclose(w[:, :, [0, 2]].sum(-1), torch.ones(1, 2, 2))
    grads = torch.autograd.grad(scaled_dot_product_attention(q.requires_grad_(), k, v, mask).sum(), q)
    assert not grads[0].isnan().any()


def test_causal_n_greater_than_m_has_empty_rows():
    q, k, v = _random(1, 1, 1, 5, 3, 4, 4, 2)
    out = scaled_dot_product_attention(q, k, v, causal=True)
    assert torch.equal(out[0, 0, :2], torch.zeros(2, 4))  # queries 0, 1 precede every key


def test_weights_rows_sum_to_one_even_with_dropout():
    q, k, v = _random(1, 2, 2, 6, 6, 8, 8, 3)
    torch.manual_seed(0)
    out, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5, return_weights=True)
    assert torch.allclose(w.sum(-1), torch.ones(1, 2, 6))
    assert not torch.allclose(out, scaled_dot_product_attention(q, k, v))  # dropout did act


def test_gradients_match_torch():
    q, k, v = (t.double().requires_grad_() for t in _random(1, 4, 2, 5, 7, 8, 8, 4))
    mask = causal_mask(5, 7)
    ours = torch.autograd.grad(scaled_dot_product_attention(q, k, v, mask).square().sum(), (q, k, v))
    theirs = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).square().sum(), (q, k, v))
    for a, b in zip(ours, theirs):
        assert torch.allclose(a, b, atol=1e-10)


@pytest.mark.parametrize("args, needle", [
    ((torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 6), torch.randn(1, 2, 5, 4)), "k must have the same head dimension"),
    ((torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 6, 4)), "v must have k's shape"),
    ((torch.randn(1, 4, 3, 4), torch.randn(1, 3, 5, 4), torch.randn(1, 3, 5, 4)), "divides q's"),
    ((torch.randn(2, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)), "share batch axes"),
    ((torch.randn(2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)), "same number of axes"),
    ((torch.randn(4), torch.randn(4), torch.randn(4)), "q must have shape"),
])
def test_bad_shapes_raise_naming_the_argument(args, needle):
    with pytest.raises(ValueError, match=needle):
        scaled_dot_product_attention(*args)


def test_bad_mask_raises_with_expected_shape():
    q, k, v = _random(2, 8, 8, 5, 5, 4, 4, 0)
    # the lecture's unsqueeze(1) of an (n, n) mask: (5, 1, 5) cannot broadcast over 8 heads
    with pytest.raises(ValueError, match=r"mask of shape \(5, 1, 5\).*\(n, m\) = \(5, 5\)"):
        scaled_dot_product_attention(q, k, v, causal_mask(5).unsqueeze(1))
    with pytest.raises(TypeError, match="mask must be a torch.Tensor"):
        scaled_dot_product_attention(q, k, v, [[True]])
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        scaled_dot_product_attention([1.0], k, v)


def test_entropy_and_jacobian():
    uniform = torch.full((5,), 0.2)
    assert attention_entropy(uniform).item() == pytest.approx(torch.log(torch.tensor(5.0)).item())
    assert attention_entropy(torch.tensor([0.0, 1.0, 0.0])).item() == 0.0
    s = torch.randn(6, dtype=torch.float64, requires_grad=True)
    a = masked_softmax(s)
    auto = torch.autograd.functional.jacobian(masked_softmax, s)
    assert torch.allclose(softmax_jacobian(a.detach()), auto)


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("bias", [False, True])
def test_mha_matches_torch_and_counts_parameters(n_kv_heads, bias):
    torch.manual_seed(0)
    d_model, h = 32, 4
    mha = MultiHeadAttention(d_model, h, n_kv_heads, bias=bias)
    h_kv = n_kv_heads or h
    d = d_model // h
    expected = 2 * d_model * d_model + 2 * d_model * h_kv * d + (2 * d_model + 2 * h_kv * d if bias else 0)
    assert sum(p.numel() for p in mha.parameters()) == expected
    x, ctx = torch.randn(2, 5, d_model), torch.randn(2, 9, d_model)
    for context, causal in ((None, True), (ctx, False)):
        src = x if context is None else context
        q = mha.q_proj(x).view(2, 5, h, d).transpose(1, 2)
        k = mha.k_proj(src).view(2, -1, h_kv, d).transpose(1, 2)
        v = mha.v_proj(src).view(2, -1, h_kv, d).transpose(1, 2)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=h_kv != h)
        ref = mha.out_proj(ref.transpose(1, 2).reshape(2, 5, d_model))
        out, w = mha(x, context, causal=causal, return_weights=True)
        assert w.shape == (2, h, 5, src.shape[1])
        assert max_abs_error(out, ref) < 1e-5


def test_mha_multi_head_equals_per_head_loop():
    torch.manual_seed(1)
    mha = MultiHeadAttention(24, 3, bias=True)
    x = torch.randn(1, 6, 24)
    heads = []
    for i in range(3):
        rows = slice(i * 8, (i + 1) * 8)
        q = x[0] @ mha.q_proj.weight[rows].T + mha.q_proj.bias[rows]
        k = x[0] @ mha.k_proj.weight[rows].T + mha.k_proj.bias[rows]
        v = x[0] @ mha.v_proj.weight[rows].T + mha.v_proj.bias[rows]
        heads.append(torch.softmax(q @ k.T / 8 ** 0.5, -1) @ v)
    loop = mha.out_proj(torch.cat(heads, -1))
    assert max_abs_error(mha(x), loop) < 1e-5


def test_mha_permutation_equivariant_without_mask():
    torch.manual_seed(2)
    mha = MultiHeadAttention(16, 2).eval()
    x = torch.randn(1, 7, 16)
    perm = torch.randperm(7)
    assert max_abs_error(mha(x[:, perm]), mha(x)[:, perm]) < 1e-5
    assert max_abs_error(mha(x[:, perm], causal=True), mha(x, causal=True)[:, perm]) > 1e-3


def test_mha_rejects_bad_input():
    with pytest.raises(ValueError, match="divisible by n_heads"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="n_kv_heads"):
        MultiHeadAttention(12, 4, 3)
    with pytest.raises(ValueError, match=r"x must have shape \(b, seq, d_model=12\)"):
        MultiHeadAttention(12, 4)(torch.randn(2, 5, 10))
