"""Schedules, scaling laws and the in-context-learning construction."""
import pytest
import torch

from attnlab.icl import gd_predictions, gd_weights, linear_self_attention, prompt_tokens, ridge_prediction
from attnlab.scaling import BESIROGLU, CHINCHILLA, kaplan_loss
from attnlab.schedules import noam_lr, warmup_cosine_lr, warmup_linear_lr
from attnlab.tasks import in_context_regression


def test_noam_schedule():
    assert noam_lr(4000, 512) == pytest.approx(6.9877e-4, rel=1e-4)
    assert noam_lr(4000, 512) >= max(noam_lr(t, 512) for t in range(1, 20000, 7))
    assert noam_lr(1, 512) == pytest.approx(1.747e-7, rel=1e-3)
    with pytest.raises(ValueError, match="step counts from 1"):
        noam_lr(0, 512)


def test_warmup_schedules_peak_and_end():
    assert warmup_cosine_lr(100, peak=1e-3, warmup=100, total=1000) == pytest.approx(1e-3)
    assert warmup_cosine_lr(1000, peak=1e-3, warmup=100, total=1000, final=1e-5) == pytest.approx(1e-5)
    assert warmup_linear_lr(1000, peak=1e-3, warmup=100, total=1000) == 0


def test_scaling_laws():
    assert kaplan_loss(2.0) / kaplan_loss(1.0) == pytest.approx(0.9487, abs=1e-4)
    for fit in (CHINCHILLA, BESIROGLU):
        n, d = fit.compute_optimal(1e23)
        n_search, _ = fit.compute_optimal_search(1e23)
        assert n_search == pytest.approx(n, rel=1e-3)
        assert 6 * n * d == pytest.approx(1e23)
    a = CHINCHILLA.beta / (CHINCHILLA.alpha + CHINCHILLA.beta)
    assert a == pytest.approx(0.4516, abs=1e-4)


@pytest.mark.parametrize("steps", [1, 5])
def test_stacked_lsa_layers_are_gradient_descent(steps):
    prompts = in_context_regression(3, 16, 4, seed=2)
    w_kq, w_pv = gd_weights(4, eta=0.2)
    tokens = prompt_tokens(prompts)
    for _ in range(steps):
        tokens = linear_self_attention(tokens, w_kq, w_pv)
    assert torch.allclose(-tokens[:, -1, -1], gd_predictions(prompts, 0.2, steps)[-1], atol=1e-12)


def test_gd_converges_to_least_squares():
    prompts = in_context_regression(3, 30, 4, seed=3)
    assert torch.allclose(gd_predictions(prompts, 0.3, 400)[-1], ridge_prediction(prompts, 0.0), atol=1e-8)
    assert torch.allclose(ridge_prediction(prompts, 0.0), prompts.y_test, atol=1e-8)   # noiseless, N > d
