"""Selective copying: the task generator, the two arms of the experiment, and the shipped models."""
import pytest
import torch

from attnlab.experiments import selective_copy
from attnlab.tasks import selective_copying


def test_prompts_hold_the_data_in_order_among_noise():
    p = selective_copying(64, n_data=4, length=20, n_values=8, n_noise=3, seed=1)
    assert p.inputs.shape == p.targets.shape == p.is_data.shape == (64, 24) and p.vocab == 12
    context = p.inputs[:, :20]
    assert (p.is_data[:, :20].sum(1) == 4).all() and not p.is_data[:, 20:].any()
    assert torch.equal(context[p.is_data[:, :20]].view(64, 4), p.data)        # the data, in order
    assert ((context < 3) == ~p.is_data[:, :20]).all()                        # everything else is noise
    assert (p.inputs[:, 20:] == p.marker).all() and (p.targets[:, :20] == -100).all()
    assert ((p.data >= 3) & (p.data < 11)).all()
    assert torch.equal(p.inputs, selective_copying(64, 4, 20, n_values=8, n_noise=3, seed=1).inputs)
    assert not torch.equal(p.inputs, selective_copying(64, 4, 20, n_values=8, n_noise=3, seed=2).inputs)
    positions = p.is_data[:, :20].float().argmax(1)
    assert len(positions.unique()) > 5                                         # the places change


def test_fixed_arm_has_token_independent_selection():
    point = selective_copy.PointConfig("fixed", 1e-2, steps=5)
    model = selective_copy.build_model(point)
    prompts = selective_copying(8, **selective_copy.TASK, seed=0)
    for layer in selective_copy.gates(model, prompts.inputs):
        delta = layer["delta"]
        assert torch.allclose(delta, delta[:1, :1].expand_as(delta))          # Δ the same for every token
    selective = selective_copy.build_model(selective_copy.PointConfig("selective", 1e-2))
    delta = selective_copy.step_sizes(selective, prompts.inputs)[0]
    assert not torch.allclose(delta, delta[:1, :1].expand_as(delta))
    with pytest.raises(ValueError, match="arm"):
        selective_copy.build_model(selective_copy.PointConfig("lti", 1e-2))


def test_a_short_run_records_what_the_chapter_reads():
    result = selective_copy.run_point(selective_copy.PointConfig("selective", 1e-2, steps=3, n_val=16, n_test=16))
    assert {"val_acc", "test_acc", "delta", "val_curve", "loss_every_25"} <= set(result)
    assert len(result["delta"]) == 2 and set(result["delta"][0]) == {"data", "noise", "marker"}


def test_shipped_sweep_and_models_agree():
    sweep = selective_copy.load()
    assert sweep["command"].startswith("python -m attnlab.experiments.selective_copy")
    points = {(r["arm"], r["lr"], r["seed"]) for r in sweep["points"]}
    assert points == {(a, lr, s) for a in selective_copy.ARMS for lr in selective_copy.LRS for s in selective_copy.SEEDS}
    summary = selective_copy.summarise(sweep["points"])
    models = selective_copy.load_pretrained()
    assert [r["seed"] for _, r in models] == list(selective_copy.SEEDS)
    chosen = {(r["arm"], r["lr"], r["seed"]): r for r in sweep["points"]}
    test = selective_copying(4096, **selective_copy.TASK, seed=selective_copy.TEST_SEED)
    for model, record in models:
        assert record["lr"] == summary["selective"]["best_lr"] and record["n_test"] == 4096
        assert record["test_acc"] == chosen[("selective", record["lr"], record["seed"])]["test_acc"]   # deterministic retraining
        assert abs(selective_copy.accuracy(model, test) - record["test_acc"]) < 0.005


def test_frozen_to_mean_removes_the_token_dependence_of_the_chosen_layer_only():
    running = lambda t: t.cumsum(1) / torch.arange(1, t.shape[1] + 1)[:, None]   # noqa: E731
    model = selective_copy.build_model(selective_copy.PointConfig("selective", 1e-2))
    prompts = selective_copying(8, **selective_copy.TASK, seed=0)
    before = selective_copy.step_sizes(model, prompts.inputs)
    with selective_copy.frozen_to_mean(model, ("delta", "B"), layers=[0]):
        during = selective_copy.step_sizes(model, prompts.inputs)
        x = torch.randn(3, 11, model.mixers[0].config.d_inner)
        _, B, C = model.mixers[0]._ssm_inputs(x)
        _, B1, _ = model.mixers[1]._ssm_inputs(x)
    assert torch.allclose(during[0], running(before[0]), rtol=1e-4, atol=1e-7)   # Δ: running mean
    _, B_raw, C_raw = type(model.mixers[0])._ssm_inputs(model.mixers[0], x)
    assert torch.allclose(B, running(B_raw), atol=1e-6) and torch.equal(C, C_raw)
    assert not torch.allclose(B1, B1[:, :1].expand_as(B1))                 # the other layer untouched
    assert torch.equal(selective_copy.step_sizes(model, prompts.inputs)[0], before[0])   # restored
    assert selective_copy.ablated_accuracy(model, prompts, ()) == selective_copy.accuracy(model, prompts)
    with pytest.raises(ValueError, match="parts"):
        selective_copy.ablated_accuracy(model, prompts, "delta")
