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


def test_per_step_schedule_is_a_polynomial_in_the_gram_matrix():
    """K steps with step sizes η_k leave the error (I − Π(I − η_k S)) S⁻¹g: order-free."""
    prompts = in_context_regression(16, 10, 3, seed=4)
    etas = [0.4, 1.3, 0.8]
    a = gd_predictions(prompts, etas, 3)[-1]
    b = gd_predictions(prompts, etas[::-1], 3)[-1]
    assert torch.allclose(a, b, atol=1e-12)                       # the factors commute
    S = prompts.x.transpose(1, 2) @ prompts.x / 10
    g = (prompts.x.transpose(1, 2) @ prompts.y.unsqueeze(-1)) / 10
    eye = torch.eye(3, dtype=torch.float64)
    prod = eye
    for e in etas:
        prod = prod @ (eye - e * S)
    w = (eye - prod) @ torch.linalg.solve(S, g)
    assert torch.allclose(a, (w.squeeze(-1) * prompts.x_test).sum(-1), atol=1e-10)
    assert torch.equal(gd_predictions(prompts, [0.5] * 2, 2), gd_predictions(prompts, 0.5, 2))
    with pytest.raises(ValueError, match="eta"):
        gd_predictions(prompts, [0.5], 2)


def test_icl_depth_sweep_point_and_shipped_file():
    from attnlab.experiments import icl_depth
    out = icl_depth.run_point(icl_depth.PointConfig(2, 1e-2, steps=5, n_val=32, n_test=32))
    assert out["layers"] == 2 and out["val_mse"] > 0 and out["test_mse"] > 0
    sweep = icl_depth.load_sweep()
    assert sweep["command"] == "python -m attnlab.experiments.icl_depth"
    assert len(sweep["points"]) == len(icl_depth.DEPTHS) * len(icl_depth.LRS) * len(icl_depth.SEEDS)
    rows = icl_depth.summarise(sweep["points"])
    assert all(len(r["test_mse"]) == 3 for r in rows.values())
