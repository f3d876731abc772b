"""Transfer questions of chapter 06: each answer computed with attnlab (see test_quiz_answers.py)."""
import math

import torch

from quiz_checks import accepts


def test_06_optimal_gd_step_n12():
    from attnlab.icl import gd_predictions
    from attnlab.tasks import in_context_regression
    n, d = 12, 3
    prompts = in_context_regression(200_000, n, d, seed=0)
    g = gd_predictions(prompts, 1.0, 1)[-1]                     # one step is linear in η: η g
    best = ((prompts.y_test * g).mean() / (g * g).mean()).item()  # argmin_η E(y − η g)²
    assert abs(best - n / (n + d + 1)) < 0.01
    accepts("06-optimal-gd-step-n12", n / (n + d + 1))


def test_06_gd_two_step_factor():
    from attnlab.icl import gd_predictions
    from attnlab.tasks import RegressionPrompts
    # one direction with eigenvalue s: N = 1 example x = √s, w = 1, so the error after K steps
    # is (1 − w_K) = Π (1 − η_k s)
    s = 1.2
    x = torch.full((1, 1, 1), math.sqrt(s), dtype=torch.float64)
    prompts = RegressionPrompts(x, x[..., 0], torch.ones(1, 1, dtype=torch.float64),
                                torch.ones(1, dtype=torch.float64),
                                torch.ones(1, 1, dtype=torch.float64))
    w2 = gd_predictions(prompts, [0.5, 1.25], 2)[-1].item()      # x_test = 1: prediction = w
    accepts("06-gd-two-step-factor", 1 - w2)


def test_06_diff_row_sum_lam06():
    from attnlab.diff_attention import differential_attention
    g = torch.Generator().manual_seed(0)
    q1, k1, q2, k2, v = (torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64) for _ in range(5))
    _, weights = differential_attention(q1, k1, q2, k2, v, 0.6, return_weights=True)
    sums = weights.sum(-1)
    assert torch.allclose(sums, sums.flatten()[0].expand_as(sums))
    accepts("06-diff-row-sum-lam06", sums.flatten()[0].item())


def test_06_lambda_init_layer9():
    from attnlab.diff_attention import lambda_init
    assert abs(lambda_init(9) - (0.8 - 0.6 * math.exp(-2.4))) < 1e-15
    accepts("06-lambda-init-layer9", lambda_init(9))


def _one_row(s1, s2, lam):
    """The differential row of one query whose two score rows are s1 and s2."""
    from attnlab.diff_attention import differential_attention
    m = len(s1)
    one = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    _, weights = differential_attention(one, s1.view(1, 1, m, 1), one, s2.view(1, 1, m, 1),
                                        torch.eye(m, dtype=torch.float64).view(1, 1, m, m), lam,
                                        scale=1.0, return_weights=True)
    return weights.flatten()


def test_06_diff_weight_target():
    a1 = torch.tensor([0.70, 0.10, 0.10, 0.10], dtype=torch.float64)
    a2 = torch.tensor([0.40, 0.20, 0.20, 0.20], dtype=torch.float64)
    row = _one_row(a1.log(), a2.log(), 0.5)        # scores log A: each softmax row is A itself
    assert torch.allclose(row[1:], torch.zeros(3, dtype=torch.float64), atol=1e-15)
    accepts("06-diff-weight-target", row[0].item())


def test_06_lambda_star():
    s1 = torch.tensor([2.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    s2 = torch.zeros(4, dtype=torch.float64)
    lam = (torch.logsumexp(s2, 0) - torch.logsumexp(s1, 0)).exp().item()     # Z2 / Z1
    row = _one_row(s1, s2, lam)
    assert row[1:].abs().max() < 1e-15 and abs(row[0] - (1 - lam)) < 1e-15
    # a λ 0.01 off leaves non-zero distractor weight
    assert _one_row(s1, s2, lam + 0.01)[1:].abs().min() > 1e-3
    accepts("06-lambda-star", lam)


def test_06_fourier_share_k3():
    from attnlab.grokking import fourier_power, key_frequencies
    p = 31
    t = torch.arange(p, dtype=torch.float64)
    table = torch.stack([torch.cos(2 * math.pi * 3 * t / p), torch.sin(2 * math.pi * 3 * t / p),
                         torch.cos(2 * math.pi * 10 * t / p)], dim=-1)
    power = fourier_power(table)
    assert key_frequencies(table, top=2) == [3, 10]
    accepts("06-fourier-share-k3", power[3].item())


def test_06_diff_value_width():
    from attnlab.diff_attention import DifferentialAttention
    with torch.device("meta"):
        layer = DifferentialAttention(512, 8)
        out = layer.heads(torch.zeros(1, 3, 512))
    assert out.shape == (1, 8, 3, 2 * layer.head_dim)
    accepts("06-diff-value-width", out.shape[-1])
