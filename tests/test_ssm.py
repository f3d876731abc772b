"""State space models: every form of a computation against its reference, in values and gradients."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from attnlab.numerics import agrees, max_abs_error
from attnlab.ssm import (
    Mamba, MambaConfig, MambaLM, discretize, lti_convolution, lti_recurrence, recurrence_rounding, s4d_real_init,
    selective_scan, ssm_kernel, state_size,
)

F64 = torch.float64


def scan_inputs(b, d, n, length, *, seed=0, dtype=F64, dt_scale=0.1, extras=True):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(b, d, length, generator=g, dtype=dtype)
    delta = torch.randn(b, d, length, generator=g, dtype=dtype)
    A = -torch.rand(d, n, generator=g, dtype=dtype) * n - 0.5
    B = torch.randn(b, n, length, generator=g, dtype=dtype)
    C = torch.randn(b, n, length, generator=g, dtype=dtype)
    kw = {}
    if extras:
        kw = dict(D=torch.randn(d, generator=g, dtype=dtype), z=torch.randn(b, d, length, generator=g, dtype=dtype),
                  delta_bias=torch.full((d,), math.log(math.expm1(dt_scale)), dtype=dtype), delta_softplus=True)
    else:
        delta = delta.abs() * dt_scale
    return (u, delta, A, B, C), kw


def naive_selective_scan(u, delta, A, B, C, D=None, z=None, *, delta_bias=None, delta_softplus=False):
    """Algorithm 2 of the Mamba paper written out with explicit loops over channels, states and time."""
    if delta_bias is not None:
        delta = delta + delta_bias[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    b, d, length = u.shape
    out = torch.zeros_like(u)
    for i in range(b):
        for c in range(d):
            h = torch.zeros(A.shape[1], dtype=u.dtype)
            for t in range(length):
                h = torch.exp(delta[i, c, t] * A[c]) * h + delta[i, c, t] * B[i, :, t] * u[i, c, t]
                out[i, c, t] = (C[i, :, t] * h).sum()
    if D is not None:
        out = out + D[:, None] * u
    return out * F.silu(z) if z is not None else out


def grads(fn, tensors):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * weight).sum().backward()
    return out.detach(), [t.grad for t in leaves]


# ------------------------------------------------------------------ chapter 10: LTI systems

@pytest.mark.parametrize("method,order", [("euler", 2), ("bilinear", 3)])
def test_discretisations_converge_to_zoh_at_their_order(method, order):
    """Ā − e^{ΔA} is O(Δ²) for Euler and O(Δ³) for bilinear; both B̄ tend to ΔB."""
    A, B = torch.tensor([-1.0, -3.0, -0.2], dtype=F64), torch.tensor([1.0, 0.5, 2.0], dtype=F64)
    errors = []
    for delta in (1e-2, 1e-3):
        A_bar, B_bar = discretize(A, B, delta, method)
        errors.append((A_bar - discretize(A, B, delta, "zoh")[0]).abs().max().item())
        assert torch.allclose(B_bar / delta, B, rtol=0.05)
    assert math.log10(errors[0] / errors[1]) == pytest.approx(order, abs=0.1)


def test_zoh_is_exact_for_a_held_input():
    """With u constant over each step, ZOH reproduces the continuous solution exactly, at any Δ."""
    A, B = torch.tensor([-0.7, -2.0], dtype=F64), torch.tensor([1.5, -0.5], dtype=F64)
    delta, steps = 0.9, 12
    A_bar, B_bar = discretize(A, B, delta, "zoh")
    h = torch.zeros(2, dtype=F64)
    for _ in range(steps):
        h = A_bar * h + B_bar * 1.0
    t = delta * steps
    exact = (torch.exp(A * t) - 1) / A * B
    assert max_abs_error(h, exact) < 1e-13


def test_zoh_limit_at_zero_and_stability():
    A_bar, B_bar = discretize(torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64), 0.5, "zoh")
    assert torch.equal(A_bar, torch.ones(3, dtype=F64)) and torch.allclose(B_bar, torch.full((3,), 0.5, dtype=F64))
    A = torch.tensor([-10.0], dtype=F64)
    assert discretize(A, torch.ones(1, dtype=F64), 0.5, "euler")[0].abs().item() > 1       # Euler: unstable
    assert discretize(A, torch.ones(1, dtype=F64), 0.5, "bilinear")[0].abs().item() < 1    # bilinear: stable
    assert discretize(A, torch.ones(1, dtype=F64), 0.5, "zoh")[0].abs().item() < 1


def test_discretize_rejects_bad_input():
    with pytest.raises(ValueError, match="method"):
        discretize(torch.ones(2), torch.ones(2), 0.1, "rk4")
    with pytest.raises(ValueError, match="delta"):
        discretize(torch.ones(2), torch.ones(2), 0.0)
    with pytest.raises(TypeError, match="tensors"):
        discretize([1.0], torch.ones(1), 0.1)


@given(b=st.integers(1, 3), d=st.integers(1, 5), n=st.integers(1, 8), length=st.integers(1, 70),
       method=st.sampled_from(["zoh", "euler", "bilinear"]), seed=st.integers(0, 2**16))
def test_recurrence_equals_fft_convolution(b, d, n, length, method, seed):
    g = torch.Generator().manual_seed(seed)
    A = -torch.rand(d, n, generator=g, dtype=F64) * 3
    B, C = torch.randn(d, n, generator=g, dtype=F64), torch.randn(d, n, generator=g, dtype=F64)
    D, u = torch.randn(d, generator=g, dtype=F64), torch.randn(b, d, length, generator=g, dtype=F64)
    A_bar, B_bar = discretize(A, B, torch.rand(d, 1, generator=g, dtype=F64) * 0.5 + 0.01, method)
    K = ssm_kernel(A_bar, B_bar, C, length)
    assert K.shape == (d, length)
    y_rec, y_conv = lti_recurrence(u, A_bar, B_bar, C, D), lti_convolution(u, K, D)
    assert max_abs_error(y_conv, y_rec) < 1e-10 * (1 + y_rec.abs().max().item())


def test_kernel_is_the_impulse_response():
    A_bar, B_bar = discretize(-torch.arange(1.0, 5.0, dtype=F64).repeat(2, 1), torch.ones(2, 4, dtype=F64), 0.1)
    C = torch.randn(2, 4, dtype=F64)
    impulse = torch.zeros(1, 2, 30, dtype=F64)
    impulse[..., 0] = 1
    assert torch.allclose(lti_recurrence(impulse, A_bar, B_bar, C)[0], ssm_kernel(A_bar, B_bar, C, 30))


def test_lti_shape_errors():
    A_bar = torch.rand(3, 4)
    with pytest.raises(ValueError, match=r"\(b, d, L\)"):
        lti_recurrence(torch.randn(3, 5), A_bar, A_bar, A_bar)
    with pytest.raises(ValueError, match="B_bar"):
        lti_recurrence(torch.randn(1, 3, 5), A_bar, torch.rand(2, 4), A_bar)
    with pytest.raises(ValueError, match="K"):
        lti_convolution(torch.randn(1, 3, 5), torch.randn(3, 6))


def test_s4d_real_init_and_state_size():
    A = s4d_real_init(3, 4)
    assert A.shape == (3, 4) and torch.equal(A[2], torch.tensor([-1.0, -2.0, -3.0, -4.0]))
    assert state_size(128, 16, 4) == 128 * 19 and state_size(8, 4) == 32
    with pytest.raises(ValueError, match="positive"):
        state_size(0, 16)


# ------------------------------------------------------------------ chapter 11: the selective scan

def test_sequential_matches_algorithm_2_written_out():
    args, kw = scan_inputs(2, 3, 4, 9)
    assert max_abs_error(selective_scan(*args, **kw), naive_selective_scan(*args, **kw)) < 1e-12


METHODS = ["chunked", "indexed", "logspace"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("length,chunk", [(1, None), (7, 3), (64, 8), (100, 16), (257, None), (30, 1), (13, 64)])
def test_methods_equal_sequential_values_and_gradients(method, length, chunk):
    args, kw = scan_inputs(2, 5, 4, length, seed=length)
    fn = lambda *t, m: selective_scan(*t[:5], D=t[5], z=t[6], delta_bias=t[7], delta_softplus=True,
                                      method=m, chunk=chunk)
    tensors = [*args, kw["D"], kw["z"], kw["delta_bias"]]
    ref, ref_grads = grads(lambda *t: fn(*t, m="sequential"), tensors)
    out, out_grads = grads(lambda *t: fn(*t, m=method), tensors)
    assert max_abs_error(out, ref) < 1e-10
    for name, g, r in zip("u delta A B C D z delta_bias".split(), out_grads, ref_grads):
        assert max_abs_error(g, r) < 1e-9 * (1 + r.abs().max().item()), name


@given(b=st.integers(1, 3), d=st.integers(1, 6), n=st.integers(1, 8), length=st.integers(1, 90),
       chunk=st.one_of(st.none(), st.integers(1, 40)), seed=st.integers(0, 2**16))
def test_chunked_equals_sequential_on_any_shape(b, d, n, length, chunk, seed):
    args, kw = scan_inputs(b, d, n, length, seed=seed)
    ref, ref_grads = grads(lambda *t: selective_scan(*t, **kw), args)
    out, out_grads = grads(lambda *t: selective_scan(*t, **kw, method="chunked", chunk=chunk), args)
    assert max_abs_error(out, ref) < 1e-10
    for g, r in zip(out_grads, ref_grads):
        assert max_abs_error(g, r) < 1e-9 * (1 + r.abs().max().item())


def test_chunked_backward_passes_gradcheck():
    args, _ = scan_inputs(1, 2, 3, 11, extras=False)
    leaves = [t.clone().requires_grad_() for t in args]
    assert torch.autograd.gradcheck(lambda *t: selective_scan(*t, method="chunked", chunk=4), leaves)


def test_fp32_chunked_agrees_by_the_2x_rule_and_logspace_is_less_accurate():
    """Against a float64 reference, the fp32 chunked form errs at most twice as much as the fp32
    sequential loop, in values and in every gradient; the log-space form, even where finite, does not."""
    args, kw = scan_inputs(1, 16, 8, 300, seed=3)
    exact, exact_grads = grads(lambda *t: selective_scan(*t, **kw), args)
    kw32 = {k: (v.float() if torch.is_tensor(v) else v) for k, v in kw.items()}
    args32 = [t.float() for t in args]
    base, base_grads = grads(lambda *t: selective_scan(*t, **kw32), args32)
    out, out_grads = grads(lambda *t: selective_scan(*t, **kw32, method="chunked", chunk=32), args32)
    assert agrees(out, base, exact)
    for g, gb, ge in zip(out_grads, base_grads, exact_grads):
        assert agrees(g, gb, ge)
    shortcut = selective_scan(*args32, **kw32, method="logspace", chunk=32)
    assert torch.isfinite(shortcut).all() and not agrees(shortcut, base, exact)
    assert max_abs_error(shortcut, exact) < 1e-3


def test_last_state_is_the_same_for_every_method():
    args, kw = scan_inputs(2, 3, 5, 23)
    _, last = selective_scan(*args, **kw, return_last_state=True)
    assert last.shape == (2, 3, 5)
    for method in METHODS:
        _, other = selective_scan(*args, **kw, method=method, chunk=5, return_last_state=True)
        assert max_abs_error(other, last) < 1e-12
    leaves = [t.clone().requires_grad_() for t in args]
    y, last = selective_scan(*leaves, **kw, method="chunked", chunk=5, return_last_state=True)
    (y.sum() + last.square().sum()).backward()
    seq_leaves = [t.clone().requires_grad_() for t in args]
    y, last = selective_scan(*seq_leaves, **kw, return_last_state=True)
    (y.sum() + last.square().sum()).backward()
    for a, b in zip(leaves, seq_leaves):
        assert max_abs_error(a.grad, b.grad) < 1e-9 * (1 + b.grad.abs().max().item())


def test_logspace_overflows_on_strong_decay_and_chunked_does_not():
    args, _ = scan_inputs(1, 4, 16, 512, dtype=torch.float32, extras=False)
    u, delta, A, B, C = args
    A = s4d_real_init(4, 16)
    delta = torch.full_like(delta, 1.0)                     # e^{ΔA} down to e^{-16} per step
    exact = selective_scan(u.double(), delta.double(), A.double(), B.double(), C.double())
    shortcut = selective_scan(u, delta, A, B, C, method="logspace", chunk=64)
    assert not torch.isfinite(shortcut).all()
    chunked = selective_scan(u, delta, A, B, C, method="chunked", chunk=64)
    assert torch.isfinite(chunked).all()
    assert agrees(chunked, selective_scan(u, delta, A, B, C), exact)


@pytest.mark.parametrize("method", ["sequential", "chunked"])
def test_selective_scan_is_causal(method):
    args, kw = scan_inputs(1, 3, 4, 40)
    u = args[0].clone().requires_grad_()
    out = selective_scan(u, *args[1:], **kw, method=method, chunk=7)
    out[..., 20].sum().backward()
    assert torch.all(u.grad[..., 21:] == 0) and u.grad[..., :21].abs().sum() > 0


def test_selective_scan_errors_name_the_argument():
    (u, delta, A, B, C), _ = scan_inputs(2, 3, 4, 10, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"u must be \(b, d, L\)"):
        selective_scan(u[..., :0], delta[..., :0], A, B[..., :0], C[..., :0])
    with pytest.raises(ValueError, match=r"u must be \(b, d, L\)"):
        selective_scan(u[0], delta, A, B, C)
    with pytest.raises(ValueError, match=r"A must be \(d, n\)"):
        selective_scan(u, delta, A.T, B, C)
    with pytest.raises(ValueError, match=r"B must have shape \(b, n, L\) = \(2, 4, 10\)"):
        selective_scan(u, delta, A, B.transpose(1, 2), C)
    with pytest.raises(ValueError, match="delta must have shape"):
        selective_scan(u, delta[..., :5], A, B, C)
    with pytest.raises(ValueError, match=r"D must have shape \(3,\)"):
        selective_scan(u, delta, A, B, C, D=torch.ones(4))
    with pytest.raises(TypeError, match="C must be a torch.Tensor"):
        selective_scan(u, delta, A, B, C.numpy())
    with pytest.raises(ValueError, match="method"):
        selective_scan(u, delta, A, B, C, method="pscan")
    with pytest.raises(ValueError, match="chunk"):
        selective_scan(u, delta, A, B, C, method="chunked", chunk=0)


# ------------------------------------------------------------------ the Mamba block

def small_mamba(method="chunked", seed=0):
    torch.manual_seed(seed)
    return Mamba(MambaConfig(d_model=8, d_state=4, d_conv=3, expand=2, method=method)).double()


@pytest.mark.parametrize("method", ["sequential", "chunked"])
def test_step_equals_forward_token_by_token(method):
    block = small_mamba(method)
    x = torch.randn(2, 13, 8, dtype=F64)
    full = block(x)
    state, outs = block.init_state(2), []
    for t in range(13):
        y, state = block.step(x[:, t], state)
        outs.append(y)
    assert max_abs_error(torch.stack(outs, 1), full) < 1e-12


def test_forward_methods_agree_and_block_is_causal():
    block = small_mamba()
    x = torch.randn(1, 21, 8, dtype=F64, requires_grad=True)
    y = block(x)
    assert max_abs_error(y, block(x, method="sequential")) < 1e-12
    y[:, 9].sum().backward()
    assert torch.all(x.grad[:, 10:] == 0) and x.grad[:, :10].abs().sum() > 0


def test_mamba_initialisation_follows_the_paper():
    cfg = MambaConfig(d_model=32, d_state=16)
    block = Mamba(cfg)
    assert torch.allclose(-block.A_log.exp()[0], -torch.arange(1.0, 17.0))     # S4D-real
    dt = F.softplus(block.dt_proj.bias.detach())
    assert dt.min() >= cfg.dt_min * 0.999 and dt.max() <= cfg.dt_max * 1.001    # softplus⁻¹ bias
    assert block.x_proj.out_features == cfg.rank + 2 * cfg.d_state and cfg.rank == 2
    conv_state, ssm_state = block.init_state(3)
    assert block.state_size() == conv_state[0].numel() + ssm_state[0].numel() == 64 * (16 + 3)


def test_mamba_shape_errors_and_language_model():
    block = small_mamba()
    with pytest.raises(ValueError, match="d_model=8"):
        block(torch.randn(2, 5, 7, dtype=F64))
    with pytest.raises(ValueError, match="u_t must be"):
        block.step(torch.randn(2, 5, 8, dtype=F64), block.init_state(2))
    torch.manual_seed(0)
    lm = MambaLM(vocab=11, n_layers=2, config=MambaConfig(d_model=16, d_state=4))
    logits = lm(torch.randint(0, 11, (3, 17)))
    assert logits.shape == (3, 17, 11) and torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(p.grad is not None for p in lm.parameters())


# ------------------------------------------------------------------ low-precision recurrence

@pytest.mark.parametrize("a", [0.875, 0.96875, 0.99609375])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rounding_error_stays_under_the_bound_and_does_not_grow(a, dtype):
    x = torch.rand(3000, generator=torch.Generator().manual_seed(0)).bfloat16()
    errors, bound = recurrence_rounding(a, x, dtype)
    assert errors.shape == (3000,) and errors.max() <= bound
    if dtype == torch.bfloat16:                                # large roundings: a visible plateau after ~1/(1 − a) steps
        running = errors.cummax(0).values
        assert running[-1] <= 1.25 * running[1499]


def test_recurrence_rounding_rejects_a_outside_the_unit_interval():
    with pytest.raises(ValueError, match="a must lie"):
        recurrence_rounding(1.0, torch.ones(4), torch.float32)
