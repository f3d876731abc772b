"""Transfer questions of chapter 10: each answer computed with attnlab (see test_quiz_answers.py)."""
import math

import torch

from quiz_checks import accepts

F64 = torch.float64


def test_10_euler_a_bar_a6():
    from attnlab.ssm import discretize
    a_bar, _ = discretize(torch.tensor([-6.0], dtype=F64), torch.tensor([1.0], dtype=F64), 0.4,
                          method="euler")
    accepts("10-euler-a-bar-a6", a_bar.item())


def test_10_zoh_memory_a02():
    from attnlab.ssm import discretize, lti_recurrence
    A, B = torch.tensor([[-0.2]], dtype=F64), torch.ones(1, 1, dtype=F64)
    a_bar, b_bar = discretize(A, B, 0.02)
    accepts("10-zoh-memory-a02", -1 / math.log(a_bar.item()))        # e-folding time in tokens
    accepts("10-zoh-memory-a02", 1 / (1 - a_bar.item()))              # total weight Σ ā^k of the past
    impulse = torch.zeros(1, 1, 400, dtype=F64)
    impulse[..., 0] = 1
    trace = lti_recurrence(impulse, a_bar, b_bar, torch.ones_like(B))[0, 0]
    below = int((trace < trace[0] / math.e).nonzero()[0])           # the first token below 1/e
    accepts("10-zoh-memory-a02", below)


def test_10_kernel_k2_value():
    from attnlab.ssm import discretize, lti_recurrence, ssm_kernel
    one = torch.ones(1, 1, dtype=F64)
    A_bar, B_bar = discretize(-one, one, 0.5)
    K = ssm_kernel(A_bar, B_bar, one, 3)[0]
    impulse = torch.tensor([[[1.0, 0.0, 0.0]]], dtype=F64)
    assert torch.allclose(lti_recurrence(impulse, A_bar, B_bar, one)[0, 0], K)
    accepts("10-kernel-k2-value", K[2].item())


def test_10_fft_min_length_l1000():
    from attnlab.ssm import lti_convolution
    L = 1000
    g = torch.Generator().manual_seed(0)
    u, K = torch.randn(1, 1, L, generator=g, dtype=F64), torch.randn(1, L, generator=g, dtype=F64)
    causal = lti_convolution(u, K)                                   # the library pads to 2L

    def exact(N):
        y = torch.fft.irfft(torch.fft.rfft(u, n=N) * torch.fft.rfft(K, n=N), n=N)[..., :L]
        return (y - causal).abs().max().item() < 1e-9

    shortest = min(N for N in range(2 * L - 3, 2 * L + 1) if exact(N))
    assert not exact(L)
    accepts("10-fft-min-length-l1000", shortest)


def test_10_direct_conv_l3000():
    L = 3000
    lag = torch.arange(L)[:, None] - torch.arange(L)[None, :]
    terms = int((lag >= 0).sum())                                    # nonzeros of the causal Toeplitz matrix
    accepts("10-direct-conv-l3000", terms)


def test_10_state_size_d2048_n64():
    from attnlab.s4d import S4D
    from attnlab.ssm import state_size
    accepts("10-state-size-d2048-n64", state_size(2048, 64, 4))
    ssm_part = S4D(2048, 64, init="real").state_size()               # the SSM's n per channel
    accepts("10-state-size-d2048-n64", ssm_part + 2048 * (4 - 1))    # plus the conv window


def test_10_s4d_lin_period():
    from attnlab.s4d import s4d_lin_init
    from attnlab.ssm import discretize
    A = s4d_lin_init(1, 16, dtype=torch.complex128)[0]
    A_bar, _ = discretize(A, torch.ones_like(A), 0.01)
    phase = A_bar.angle() / (2 * math.pi)                           # turns per token
    P = next(P for P in range(1, 1001)
             if all(abs(x - round(x)) < 1e-9 for x in (P * phase).tolist()))
    accepts("10-s4d-lin-period", P)


def test_10_hippo_legs_entry():
    from attnlab.s4d import hippo_legs
    A, _ = hippo_legs(4)
    accepts("10-hippo-legs-entry", A[3, 1].item())
