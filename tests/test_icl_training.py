"""A trainable stack of linear self-attention layers: GD weights reproduce GD; training finds GD."""
import pytest
import torch

from attnlab.icl import (
    LinearSelfAttentionStack, effective_step_size, gd_predictions, gd_weights, prompt_tokens,
)
from attnlab.tasks import in_context_regression
from attnlab.train import train


def test_stack_with_gd_weights_is_gradient_descent():
    prompts = in_context_regression(8, 13, 3, seed=2)
    model = LinearSelfAttentionStack(3, n_layers=4).double()
    w_kq, w_pv = gd_weights(3, 0.3)
    with torch.no_grad():
        model.w_kq.copy_(w_kq.expand(4, -1, -1))
        model.w_pv.copy_(w_pv.expand(4, -1, -1))
    assert torch.allclose(model(prompt_tokens(prompts)), gd_predictions(prompts, 0.3, 4)[-1], atol=1e-12)
    assert effective_step_size(w_kq, w_pv) == (pytest.approx(0.3), 0.0)
    with pytest.raises(ValueError, match=r"\(b, N \+ 1, d \+ 1 = 4\)"):
        model(torch.zeros(2, 5, 3, dtype=torch.float64))


def test_trained_layer_finds_a_gradient_step():
    d, n = 4, 16
    model = LinearSelfAttentionStack(d)

    def batch(step):
        prompts = in_context_regression(128, n, d, seed=step, dtype=torch.float32)
        return prompt_tokens(prompts), prompts.y_test

    train(model, batch, steps=300, lr=1e-2, warmup=20, loss_fn=lambda m, x, y: (m(x) - y).square().mean(),
          progress=False)
    eta, distance = effective_step_size(model.w_kq[0].detach(), model.w_pv[0].detach())
    assert eta == pytest.approx(n / (n + d + 1), rel=0.1)   # the best single step for Gaussian x
    assert distance < 0.1
