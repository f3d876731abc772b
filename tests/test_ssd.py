"""State space duality: the recurrent, quadratic and chunked forms of a scalar-decay SSM are one function."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from attnlab.linear import elu_feature, gated_linear_attention, linear_attention
from attnlab.numerics import max_abs_error
from attnlab.ssd import SSD_METHODS, segsum, ssd, ssd_chunked, ssd_flops, ssd_matrix, ssd_quadratic, ssd_recurrent
from attnlab.ssm import selective_scan

F64 = torch.float64


def inputs(b, L, h, p, g, n, seed=0, dtype=F64, decay=1.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, L, h, p, generator=gen, dtype=dtype)
    log_a = -decay * torch.rand(b, L, h, generator=gen, dtype=dtype)
    B, C = (torch.randn(b, L, g, n, generator=gen, dtype=dtype) for _ in range(2))
    return x, log_a, B, C


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 2), L=st.integers(1, 70), heads_per_group=st.integers(1, 3), groups=st.integers(1, 2),
       p=st.integers(1, 4), n=st.integers(1, 5), chunk=st.integers(1, 24), seed=st.integers(0, 2**16))
def test_three_forms_agree_on_any_shape(b, L, heads_per_group, groups, p, n, chunk, seed):
    """Lengths that are not multiples of the chunk included; outputs and final states."""
    x, log_a, B, C = inputs(b, L, heads_per_group * groups, p, groups, n, seed)
    y_rec, H_rec = ssd_recurrent(x, log_a, B, C)
    y_chk, H_chk = ssd_chunked(x, log_a, B, C, chunk=chunk)
    scale = 1 + y_rec.abs().max().item()
    assert y_rec.shape == x.shape and H_rec.shape == (b, x.shape[2], n, p)
    assert max_abs_error(y_chk, y_rec) < 1e-11 * scale
    assert max_abs_error(H_chk, H_rec) < 1e-11 * (1 + H_rec.abs().max().item())
    assert max_abs_error(ssd_quadratic(x, log_a, B, C), y_rec) < 1e-11 * scale


def test_quadratic_form_is_the_masked_matrix():
    x, log_a, B, C = inputs(1, 9, 2, 3, 1, 4, seed=1)
    M = ssd_matrix(log_a, B, C)
    a = log_a.exp()
    for t, s in [(5, 2), (8, 0), (3, 3)]:
        decay = a[0, s + 1:t + 1, 1].prod()
        assert torch.allclose(M[0, 1, t, s], decay * (C[0, t, 0] @ B[0, s, 0]))
    assert (M[0, :, 2, 5] == 0).all()                                     # the future is masked
    y = (M @ x.transpose(1, 2)).transpose(1, 2)
    assert max_abs_error(y, ssd_recurrent(x, log_a, B, C)[0]) < 1e-12


def test_segsum_sums_each_segment_directly():
    """Its entries are segment sums; a difference of prefix sums loses them in float32, segsum does not."""
    log_a = torch.tensor([-3.0, -0.5, -2.0, -0.25], dtype=F64)
    S = segsum(log_a)
    assert S[3, 1] == -2.25 and S[2, 2] == 0 and S[1, 3] == float("-inf")
    big = torch.cat([torch.full((64,), -1e4), torch.full((8,), -1e-3)]).float()   # a long decayed past
    exact = segsum(big.double())[-1, -8]                                # = 7 × (−1e-3)
    cancelling = big.cumsum(0)[-1] - big.cumsum(0)[-8]
    assert abs(segsum(big)[-1, -8].item() - exact.item()) < 1e-9
    assert abs(cancelling.item() - exact.item()) > 1e-3


@pytest.mark.parametrize("method", SSD_METHODS)
def test_gradients_agree_with_the_recurrence(method):
    leaves = [t.requires_grad_() for t in inputs(2, 23, 4, 3, 2, 5, seed=3)]
    ref = torch.autograd.grad(ssd_recurrent(*leaves)[0].square().sum(), leaves)
    got = torch.autograd.grad(ssd(*leaves, method=method, chunk=6).square().sum(), leaves)
    for name, r, g in zip(("x", "log_a", "B", "C"), ref, got):
        assert max_abs_error(g, r) < 1e-10 * (1 + r.abs().max().item()), name


def test_initial_state_continues_a_sequence():
    x, log_a, B, C = inputs(2, 50, 2, 3, 1, 4, seed=4)
    whole, final = ssd_recurrent(x, log_a, B, C)
    for fn in (ssd_recurrent, lambda *t, **kw: ssd_chunked(*t, chunk=7, **kw)):
        y1, H = fn(x[:, :21], log_a[:, :21], B[:, :21], C[:, :21])
        y2, H = fn(x[:, 21:], log_a[:, 21:], B[:, 21:], C[:, 21:], initial_state=H)
        assert max_abs_error(torch.cat([y1, y2], 1), whole) < 1e-12 and max_abs_error(H, final) < 1e-12


def test_unit_decay_is_causal_linear_attention():
    """a_t = 1: numerator and normaliser as two SSD runs give chapter 9's causal linear attention."""
    g = torch.Generator().manual_seed(5)
    b, h, L, m, p = 2, 3, 33, 4, 5
    q, k = (torch.randn(b, h, L, m, generator=g, dtype=F64) for _ in range(2))
    v = torch.randn(b, h, L, p, generator=g, dtype=F64)
    T = lambda t: t.transpose(1, 2)                                       # noqa: E731
    zero = torch.zeros(b, L, h, dtype=F64)
    fq, fk = elu_feature(q), elu_feature(k)
    for method in SSD_METHODS:
        num = ssd(T(v), zero, T(fk), T(fq), method=method, chunk=8)
        den = ssd(torch.ones(b, L, h, 1, dtype=F64), zero, T(fk), T(fq), method=method, chunk=8)
        assert max_abs_error(T(num / den), linear_attention(q, k, v, feature_map="elu", causal=True)) < 1e-12
    log_decay = -torch.rand(b, h, L, generator=g, dtype=F64)              # one decay for all key dimensions
    gla = gated_linear_attention(q, k, v, log_decay[..., None].expand(b, h, L, m).contiguous())
    assert max_abs_error(T(ssd(T(v), T(log_decay), T(k), T(q))), gla) < 1e-12


def test_mamba1_with_one_decay_per_channel_is_ssd_with_scalar_heads():
    g = torch.Generator().manual_seed(6)
    b, d, n, L = 2, 5, 4, 29
    u, delta = torch.randn(b, d, L, generator=g, dtype=F64), torch.rand(b, d, L, generator=g, dtype=F64)
    A = -torch.rand(d, 1, generator=g, dtype=F64)
    B, C = (torch.randn(b, n, L, generator=g, dtype=F64) for _ in range(2))
    ref = selective_scan(u, delta, A.expand(d, n), B, C)
    y = ssd((delta * u).transpose(1, 2)[..., None], (delta * A).transpose(1, 2),
            B.transpose(1, 2)[:, :, None], C.transpose(1, 2)[:, :, None], chunk=8)
    assert max_abs_error(y[..., 0].transpose(1, 2), ref) < 1e-12


@pytest.mark.parametrize("L,chunk", [(64, 16), (100, 32), (4096, 64), (7, 64)])
def test_ssd_flops_is_what_torch_counts(L, chunk):
    n, p = 8, 6
    x, B, C = (torch.zeros(1, L, 1, s, device="meta") for s in (p, n, n))
    log_a = torch.zeros(1, L, 1, device="meta")
    for c, fn in ((None, lambda: ssd_quadratic(x, log_a, B, C)), (chunk, lambda: ssd_chunked(x, log_a, B, C, chunk=chunk))):
        with FlopCounterMode(display=False) as counter:
            fn()
        assert counter.get_total_flops() == ssd_flops(L, n, p, chunk=c)


def test_strong_decay_stays_finite_in_float32():
    """Every exponent in the chunked form is <= 0: a sharply decaying input cannot overflow."""
    x, log_a, B, C = inputs(1, 256, 2, 4, 1, 8, seed=7, dtype=torch.float32, decay=40.0)
    y, H = ssd_chunked(x, log_a, B, C, chunk=64)
    exact = ssd_recurrent(*(t.double() for t in (x, log_a, B, C)))[0]
    assert torch.isfinite(y).all() and max_abs_error(y.double(), exact) < 1e-4 * (1 + exact.abs().max().item())
