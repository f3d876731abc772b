"""The S4D layer (convolution = recurrence = step, kernel = the SSM's impulse response) and
the HiPPO-LegS memory (its state holds the Legendre coefficients of the history)."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from attnlab.numerics import max_abs_error
from attnlab.s4d import S4D, hippo_legs, legendre_reconstruct, legs_memory, s4d_lin_init
from attnlab.ssm import discretize, lti_convolution, lti_recurrence, s4d_real_init, ssm_kernel

F64 = torch.float64


def layer(d, n, init, seed=0, **kw):
    return S4D(d, n, init=init, generator=torch.Generator().manual_seed(seed), **kw).double()


@settings(deadline=None, max_examples=30)
@given(b=st.integers(1, 3), d=st.integers(1, 4), modes=st.integers(1, 6), length=st.integers(1, 60),
       init=st.sampled_from(["lin", "real"]), seed=st.integers(0, 2**16))
def test_convolution_mode_equals_recurrence_mode_and_step(b, d, modes, length, init, seed):
    s4d = layer(d, 2 * modes, init, seed)
    u = torch.randn(b, d, length, generator=torch.Generator().manual_seed(seed + 1), dtype=F64)
    y_conv, y_rec = s4d(u), s4d(u, mode="recurrence")
    state, ys = None, []
    for u_t in u.unbind(-1):
        y_t, state = s4d.step(u_t, state)
        ys.append(y_t)
    scale = 1 + y_rec.abs().max().item()
    assert y_conv.shape == (b, d, length) and not y_conv.is_complex()
    assert max_abs_error(y_conv, y_rec) < 1e-10 * scale
    assert max_abs_error(torch.stack(ys, -1), y_rec) < 1e-12 * scale


@pytest.mark.parametrize("init", ["lin", "real"])
def test_kernel_is_the_library_kernel_of_the_discretised_modes(init):
    s4d = layer(3, 8, init)
    A_bar, B_bar, C = s4d.discrete()
    K = ssm_kernel(A_bar, B_bar, C, 50)
    assert max_abs_error(s4d.kernel(50), K.real if K.is_complex() else K) < 1e-12
    impulse = torch.zeros(1, 3, 50, dtype=F64)
    impulse[..., 0] = 1
    with torch.no_grad():
        s4d.D.zero_()
    assert max_abs_error(s4d(impulse)[0], s4d.kernel(50)) < 1e-12       # the impulse response


def test_initialisation_follows_s4d():
    s4d = S4D(5, 16, dt_min=1e-3, dt_max=1e-1, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(s4d.A, s4d_lin_init(5, 16))
    A = s4d_lin_init(1, 8, dtype=torch.complex128)[0]
    assert torch.equal(A.real, torch.full((4,), -0.5, dtype=F64))
    assert torch.allclose(A.imag, math.pi * torch.arange(4, dtype=F64))
    dt = s4d.log_dt.exp()
    assert dt.shape == (5,) and ((1e-3 <= dt) & (dt <= 1e-1)).all()
    real = S4D(2, 6, init="real")
    assert torch.equal(real.A, s4d_real_init(2, 6)) and not hasattr(real, "A_im")
    assert torch.view_as_complex(s4d.C).shape == (5, 8) and real.C.shape == (2, 6)


def test_every_parameter_learns():
    s4d = layer(2, 8, "lin")
    u = torch.randn(2, 2, 20, dtype=F64)
    s4d(u).square().sum().backward()
    for name, p in s4d.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_complex_modes_discretise_like_real_ones_on_the_real_axis():
    A = -torch.tensor([[0.5, 2.0]], dtype=F64)
    for method in ("zoh", "bilinear", "euler"):
        real = discretize(A, torch.ones_like(A), 0.3, method)
        cplx = discretize(A.to(torch.complex128), torch.ones_like(A), 0.3, method)
        for r, c in zip(real, cplx):
            assert torch.allclose(c.real, r) and (not c.is_complex() or c.imag.abs().max() == 0)
    # ZOH of a complex mode: Ā = e^{Δa}, B̄ = (e^{Δa} − 1)/a, by hand
    a = torch.tensor([[-0.5 + 3j]], dtype=torch.complex128)
    A_bar, B_bar = discretize(a, torch.ones_like(a), 0.1)
    assert torch.allclose(A_bar, torch.exp(0.1 * a)) and torch.allclose(B_bar, (torch.exp(0.1 * a) - 1) / a)
    y = lti_recurrence(torch.ones(1, 1, 5, dtype=F64), A_bar, B_bar, torch.ones_like(a))
    assert y.is_complex()


def test_hippo_legs_matches_its_definition():
    A, B = hippo_legs(4)
    r3, r5, r7 = math.sqrt(3), math.sqrt(5), math.sqrt(7)
    expected = -torch.tensor([[1, 0, 0, 0], [r3, 2, 0, 0], [r5, r5 * r3, 3, 0], [r7, r7 * r3, r7 * r5, 4]],
                             dtype=F64)
    assert torch.allclose(A, expected) and torch.allclose(B, torch.tensor([1, r3, r5, r7], dtype=F64))
    A, _ = hippo_legs(12)
    P = (torch.arange(12, dtype=F64) + 0.5).sqrt()
    normal = A + torch.outer(P, P)                  # normal part: −I/2 plus a skew-symmetric matrix
    assert torch.allclose(normal + normal.T, -torch.eye(12, dtype=F64))


def exact_projection(f, n):
    """Coefficients of the held signal (f_k on (k-1, k]) projected on [0, L] onto the scaled
    Legendre basis, integrated exactly: ∫P_j = (P_{j+1} - P_{j-1}) / (2j + 1), ∫P_0 = x."""
    L = f.shape[0]
    x = 2 * torch.arange(L + 1, dtype=F64) / L - 1
    P = [torch.ones_like(x), x]
    for j in range(1, n):
        P.append(((2 * j + 1) * x * P[j] - j * P[j - 1]) / (j + 1))
    Q = torch.stack([x] + [(P[j + 1] - P[j - 1]) / (2 * j + 1) for j in range(1, n)])
    return (2 * torch.arange(n, dtype=F64) + 1).sqrt() / 2 * ((Q[:, 1:] - Q[:, :-1]) @ f)


@pytest.mark.parametrize("n", [1, 5, 24])
def test_legs_memory_is_the_exact_legendre_projection_of_the_history(n):
    L = 600
    t = (torch.arange(L, dtype=F64) + 0.5) / L
    f = torch.sin(7 * t) + 0.5 * torch.cos(19 * t) + t
    c = legs_memory(f, n)
    assert c.shape == (L, n)
    for k in (1, 2, 37, L):                                   # at every time, of all that came before
        assert max_abs_error(c[k - 1], exact_projection(f[:k], n)) < 1e-10
    A, B = hippo_legs(n)
    assert torch.allclose(-torch.linalg.solve(A, B), torch.eye(n, dtype=F64)[0])   # -A⁻¹B = e₀


def test_the_reconstruction_is_orthonormal_and_recovers_smooth_histories():
    L, n = 2000, 24
    basis = legendre_reconstruct(torch.eye(n, dtype=F64), L)       # (n, L): the scaled basis
    assert torch.allclose(basis @ basis.T / L, torch.eye(n, dtype=F64), atol=2e-3)   # midpoint rule
    t = (torch.arange(L, dtype=F64) + 0.5) / L
    f = torch.sin(7 * t) + 0.5 * torch.cos(19 * t) + t
    assert (legendre_reconstruct(legs_memory(f, n)[-1], L) - f).abs().max() < 1e-3
    g = 1 - 3 * t + 2 * t**3                                        # degree 3 < n = 6
    half = L // 2
    assert (legendre_reconstruct(legs_memory(g, 6)[half - 1], half) - g[:half]).abs().max() < 1e-3


def test_legendre_reconstruct_degree_zero_and_one():
    c = torch.tensor([2.0, 0.0], dtype=F64)
    assert torch.allclose(legendre_reconstruct(c, 5), torch.full((5,), 2.0, dtype=F64))
    line = legendre_reconstruct(torch.tensor([0.0, 1.0], dtype=F64), 4)
    assert torch.allclose(line, math.sqrt(3) * torch.tensor([-0.75, -0.25, 0.25, 0.75], dtype=F64))
    assert legendre_reconstruct(torch.ones(3, 2, dtype=F64), 0).shape == (3, 0)
    assert legs_memory(torch.zeros(0, dtype=F64), 3).shape == (0, 3)


def test_bad_input_names_the_argument():
    s4d = S4D(3, 8)
    cases = [
        (lambda: S4D(3, 7), ValueError, "n must be even"),
        (lambda: S4D(0, 8), ValueError, "d"),
        (lambda: S4D(3, 8, init="hippo"), ValueError, "init"),
        (lambda: S4D(3, 8, dt_min=0.1, dt_max=0.01), ValueError, "dt_min"),
        (lambda: s4d(torch.randn(2, 4, 10)), ValueError, "u must be"),
        (lambda: s4d(torch.randn(3, 10)), ValueError, "u must be"),
        (lambda: s4d(torch.ones(1, 3, 10, dtype=torch.long)), TypeError, "u must be a floating"),
        (lambda: s4d(torch.randn(1, 3, 10), mode="scan"), ValueError, "mode"),
        (lambda: s4d.step(torch.randn(2, 4)), ValueError, "u_t"),
        (lambda: s4d.step(torch.randn(2, 3), torch.zeros(2, 3, 5)), ValueError, "state"),
        (lambda: s4d.kernel(-1), ValueError, "length"),
        (lambda: s4d_lin_init(2, 5), ValueError, "n must be even"),
        (lambda: hippo_legs(0), ValueError, "n"),
        (lambda: legs_memory(torch.randn(3, 4), 4), ValueError, "f must be"),
        (lambda: legs_memory(torch.arange(4), 4), TypeError, "f must be"),
        (lambda: legendre_reconstruct(torch.randn(3, 0), 4), ValueError, "c must be"),
        (lambda: legendre_reconstruct(torch.randn(3), -2), ValueError, "length"),
    ]
    for call, kind, words in cases:
        with pytest.raises(kind, match=words):
            call()


@settings(deadline=None, max_examples=25)
@given(b=st.integers(1, 2), d=st.integers(1, 3), modes=st.integers(1, 5), prompt=st.integers(0, 40),
       more=st.integers(1, 12), init=st.sampled_from(["lin", "real"]), seed=st.integers(0, 2**16))
def test_prefill_state_then_step_continues_the_convolution(b, d, modes, prompt, more, init, seed):
    """The prompt runs as a convolution; its closed-form state hands over to step()."""
    s4d = layer(d, 2 * modes, init, seed)
    u = torch.randn(b, d, prompt + more, generator=torch.Generator().manual_seed(seed + 1), dtype=F64)
    full = s4d(u)
    y_prompt, state = s4d(u[..., :prompt], return_state=True)
    stepped, ys = None, []
    for u_t in u[..., :prompt].unbind(-1):
        _, stepped = s4d.step(u_t, stepped)
    scale = 1 + full.abs().max().item()
    if prompt:
        assert (state - stepped).abs().max() < 1e-12 * scale
    else:
        assert state.shape == (b, d, s4d.A.shape[1]) and state.abs().max() == 0
    for u_t in u[..., prompt:].unbind(-1):
        y_t, state = s4d.step(u_t, state)
        ys.append(y_t)
    assert max_abs_error(torch.cat([y_prompt, torch.stack(ys, -1)], -1), full) < 1e-10 * scale
    y_rec, state_rec = s4d(u, mode="recurrence", return_state=True)
    assert max_abs_error(y_rec, full) < 1e-10 * scale
    assert (state_rec - state).abs().max() < 1e-10 * scale


def test_state_size_counts_n_real_numbers_per_channel():
    lin, real = S4D(5, 16), S4D(3, 6, init="real")
    _, state = lin.step(torch.randn(2, 5))
    assert lin.state_size() == 80 == 2 * state[0].numel()          # 8 complex modes = 16 reals
    _, state = real.step(torch.randn(2, 3))
    assert real.state_size() == 18 == state[0].numel()


@pytest.mark.parametrize("length", [1000, 4999])
@pytest.mark.parametrize("complex_modes", [False, True])
def test_fp32_fft_convolution_is_as_accurate_as_the_fp32_recurrence(length, complex_modes):
    """The numerics rule: the fast form's error against float64 is at most twice the fp32
    reference form's (here the recurrence), on odd lengths and complex modes too."""
    g = torch.Generator().manual_seed(length)
    d, n = 4, 8
    if complex_modes:
        A = torch.complex(-torch.rand(d, n, generator=g, dtype=F64) - 0.05,
                          3 * torch.randn(d, n, generator=g, dtype=F64))
        C = torch.complex(*torch.randn(2, d, n, generator=g, dtype=F64))
    else:
        A, C = -torch.rand(d, n, generator=g, dtype=F64) - 0.05, torch.randn(d, n, generator=g, dtype=F64)
    dt = torch.logspace(-2, -0.5, d, dtype=F64)[:, None]
    A_bar, B_bar = discretize(A, torch.ones_like(A), dt)
    u = torch.randn(2, d, length, generator=g, dtype=F64)
    truth = lti_convolution(u, ssm_kernel(A_bar, B_bar, C, length))
    assert (truth - lti_recurrence(u, A_bar, B_bar, C)).abs().max() < 1e-9 * truth.abs().max()
    low = torch.complex64 if complex_modes else torch.float32
    A32, B32, C32 = (t.to(low) for t in (A_bar, B_bar, C))
    u32 = u.float()
    fast = lti_convolution(u32, ssm_kernel(A32, B32, C32, length))
    reference = lti_recurrence(u32, A32, B32, C32)
    assert fast.dtype == reference.dtype == low

    def error(x):                                             # also for complex outputs
        return (x.to(truth.dtype) - truth).abs().max().item()

    err_fast, err_ref = error(fast), error(reference)
    assert err_fast <= 2 * err_ref, (err_fast, err_ref)


def test_lti_forms_reject_bad_input_naming_the_argument():
    A_bar, B_bar = discretize(-torch.rand(2, 3) - 0.1, torch.ones(2, 3), 0.1)
    C, u = torch.randn(2, 3), torch.randn(1, 2, 7)
    K = ssm_kernel(A_bar, B_bar, C, 7)
    cases = [
        (lambda: ssm_kernel(A_bar, B_bar, torch.ones(3), 7), ValueError, "C must have A_bar's shape"),
        (lambda: ssm_kernel(A_bar, [1.0], C, 7), TypeError, "B_bar must be a torch.Tensor"),
        (lambda: lti_convolution([1.0, 2.0], K), TypeError, "u must be a torch.Tensor"),
        (lambda: lti_convolution(u, K, torch.ones(3)), ValueError, "D must be"),
        (lambda: lti_convolution(u, K[:, :5]), ValueError, "K must be"),
        (lambda: lti_recurrence(u, A_bar, B_bar, C, torch.ones(2, 1)), ValueError, "D must be"),
        (lambda: lti_recurrence(u, A_bar, B_bar[:, :2], C), ValueError, "B_bar must be"),
        (lambda: discretize(-torch.rand(2, 3), torch.ones(4), 0.1), ValueError, "B must broadcast"),
        (lambda: discretize(-torch.rand(2, 3), torch.ones(3), torch.full((4, 1, 1), 0.1).reshape(4, 1)),
         ValueError, "delta must broadcast"),
        (lambda: S4D(3, 8).state_after(torch.randn(1, 4, 5)), ValueError, "u must be"),
    ]
    for call, kind, words in cases:
        with pytest.raises(kind, match=words):
            call()
    from attnlab.ssm import state_size
    with pytest.raises(TypeError, match="d must be a positive int"):
        state_size(2.5, 16, 4)
    # a complex kernel gives the complex output of the recurrence
    Ac = torch.complex(-torch.rand(2, 3), torch.randn(2, 3))
    Ab, Bb = discretize(Ac, torch.ones_like(Ac), 0.1)
    Cc = torch.complex(*torch.randn(2, 2, 3))
    y = lti_convolution(u, ssm_kernel(Ab, Bb, Cc, 7))
    assert y.is_complex() and (y - lti_recurrence(u, Ab, Bb, Cc)).abs().max() < 1e-5


def test_delay_experiment_smoke_and_shipped_file():
    from attnlab.experiments import s4d_delay
    point = s4d_delay.run_point(s4d_delay.PointConfig("chapter", steps=3, n_test=8))
    assert len(point["test_error"]) == 4 and len(point["after"]["dt"]) == 4
    assert point["before"]["re_a"] == [0.5] * 4                       # S4D-Lin starts at Re a = -1/2
    data = s4d_delay.load()
    assert data["command"].startswith("python -m attnlab.experiments.s4d_delay")
    errors = s4d_delay.errors_by_range(data["points"])
    assert sorted(errors) == ["chapter", "s4d default"] and all(len(v) == 5 for v in errors.values())
    assert all(max(e) < 0.1 for e in errors["chapter"])               # what chapter 10 states
    assert sum(max(e) < 0.1 for e in errors["s4d default"]) <= 2
    u = s4d_delay.smooth_noise(2, 4, 30, 4, torch.Generator().manual_seed(0))
    assert u.shape == (2, 4, 30)
    y = s4d_delay.delayed(u, s4d_delay.DELAYS[:2] + (0, 0))
    assert torch.equal(y[:, 0, 8:], u[:, 0, :-8]) and y[:, 0, :8].abs().max() == 0
