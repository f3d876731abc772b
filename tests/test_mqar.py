"""The recall lab: the MQAR task is what it claims to be, the sweep records what it trained,
and the shipped sweeps are consistent with the code that made them (configs, state sizes,
parameter counts, curves)."""
import json
from dataclasses import fields

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnlab.experiments import mqar as lab
from attnlab.hybrid import HybridConfig, HybridLM, LayerSpec
from attnlab.tasks import mqar


@given(n_pairs=st.integers(1, 12), extra=st.integers(0, 12), n_values=st.integers(1, 20), seed=st.integers(0, 99),
       fraction=st.floats(0.1, 1.0))
def test_every_query_asks_for_the_value_bound_to_its_key(n_pairs, extra, n_values, seed, fraction):
    n_keys = n_pairs + extra
    n_queries = max(1, round(fraction * n_pairs))
    b = mqar(3, n_pairs, n_queries=n_queries, n_keys=n_keys, n_values=n_values, seed=seed)
    assert b.inputs.shape == b.targets.shape == (3, 2 * (n_pairs + n_queries))
    assert b.vocab == n_keys + n_values
    context = b.inputs[:, : 2 * n_pairs]
    keys, values = context[:, 0::2], context[:, 1::2]
    assert bool((keys < n_keys).all() and (values >= n_keys).all() and (values < n_keys + n_values).all())
    for row in range(3):
        assert len(set(keys[row].tolist())) == n_pairs                       # distinct keys
        binding = dict(zip(keys[row].tolist(), values[row].tolist()))
        asked = b.query_mask[row].nonzero().flatten().tolist()
        assert len(asked) == n_queries and len({b.inputs[row, i].item() for i in asked}) == n_queries
        for i in asked:
            assert i >= 2 * n_pairs
            assert b.targets[row, i].item() == binding[b.inputs[row, i].item()] == b.inputs[row, i + 1].item()
    assert torch.equal(b.inputs.gather(1, b.answer_positions()), b.targets[b.query_mask].view(3, n_queries))


def test_mqar_is_seeded():
    assert torch.equal(mqar(4, 8, seed=3).inputs, mqar(4, 8, seed=3).inputs)
    assert not torch.equal(mqar(4, 8, seed=3).inputs, mqar(4, 8, seed=4).inputs)


def test_mqar_bad_input_is_named():
    with pytest.raises(ValueError, match="n_pairs must be between 1 and n_keys=4"):
        mqar(2, 5, n_keys=4)
    with pytest.raises(ValueError, match="n_queries must be between 1 and n_pairs=3"):
        mqar(2, 3, n_queries=4)
    with pytest.raises(ValueError, match="batch and n_values must be positive"):
        mqar(0, 3)


class Oracle(torch.nn.Module):
    """Looks the answer up: logits one-hot on the value that followed the same key earlier."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, tokens):
        logits = torch.zeros(*tokens.shape, self.vocab)
        for row in range(tokens.shape[0]):
            seen = {}
            for i in range(tokens.shape[1] - 1):
                token = tokens[row, i].item()
                if token in seen:
                    logits[row, i, seen[token]] = 1.0
                else:
                    seen.setdefault(token, tokens[row, i + 1].item())
        return logits


def test_recall_accuracy_is_one_for_an_oracle_and_chance_for_a_constant():
    b = mqar(16, 6, seed=1)
    assert lab.recall_accuracy(Oracle(b.vocab), b.inputs, b.targets) == 1.0
    constant = lambda tokens: torch.zeros(*tokens.shape, b.vocab)          # always predicts token 0, a key
    assert lab.recall_accuracy(constant, b.inputs, b.targets) == 0.0


def test_models_are_causal_with_learned_positions():
    torch.manual_seed(0)
    for architecture in lab.ARCHITECTURES:
        model = lab.build_model(lab.PointConfig(architecture, 16, n_pairs=3)).double()
        tokens = mqar(2, 3, seed=0).inputs
        changed = tokens.clone()
        changed[:, 6:] = (changed[:, 6:] + 1) % 128
        assert torch.equal(model(tokens)[:, :6], model(changed)[:, :6]), architecture


def test_positions_are_learned_and_bounded_by_max_len():
    model = HybridLM([LayerSpec("attention")], HybridConfig(vocab=8, d_model=8, n_heads=2, max_len=5))
    assert model.embed_tokens(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, 8)
    with pytest.raises(ValueError, match="length 6; config.max_len is 5"):
        model(torch.zeros(1, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="architecture must be one of"):
        lab.build_model(lab.PointConfig("transformer", 16))


def test_state_sizes_follow_the_formulas():
    L, d = 32, 16
    size = lambda arch: lab.build_model(lab.PointConfig(arch, d, n_pairs=L // 4)).state_size(L)
    assert size("attention") == 2 * 2 * L * d                             # K and V, every position, 2 layers
    assert size("sliding_window") == 2 * 2 * 8 * (d // 2)                 # one KV head, the last w positions
    assert size("linear_attention") == 2 * 2 * ((d // 2) ** 2 + d // 2)   # h (d_h² + d_h) per layer
    assert size("mamba") == 2 * 2 * d * (16 + 3)                          # d_inner (n + d_conv − 1) per layer
    assert size("hybrid") == size("mamba") // 2 + size("attention") // 2


def test_run_point_records_its_run():
    point = lab.PointConfig("attention", 8, n_pairs=2, steps=4, eval_every=2, eval_size=8, batch=4, warmup=1)
    result = lab.run_point(point)
    assert result["curve"]["step"] == [2, 4] and result["steps_run"] == 4
    assert result["accuracy"] == max(result["curve"]["accuracy"])
    assert result["solved"] == (result["accuracy"] >= point.solved_at)
    assert result["state_size"] == lab.build_model(point).state_size(8)
    json.dumps(result)


def test_sweep_writes_after_each_point_and_resumes(tmp_path, monkeypatch):
    ran = []

    def fake_run(point, progress=False):
        ran.append((point.architecture, point.d_model))
        return {"architecture": point.architecture, "d_model": point.d_model, "accuracy": 0.5}

    monkeypatch.setattr(lab, "run_point", fake_run)
    out = tmp_path / "sweep.json"
    lab.run_sweep(lab.sweep_points((8,), ("attention", "mamba")), out, progress=False, command="test")
    assert json.loads(out.read_text())["command"] == "test" and len(ran) == 2
    result = lab.run_sweep(lab.sweep_points((8, 16), ("attention", "mamba")), out, resume=True, progress=False)
    assert sorted(ran[2:]) == [("attention", 16), ("mamba", 16)]                 # only the new points ran
    assert [(r["architecture"], r["d_model"]) for r in result["points"]] == [
        ("attention", 8), ("attention", 16), ("mamba", 8), ("mamba", 16)]


@pytest.mark.parametrize("name", [lab.DATA_FILE, "mqar_lr_check.json"])
def test_shipped_sweeps_match_the_code_that_made_them(name):
    sweep = lab.load_sweep(name)
    assert sweep["command"].startswith("python -m attnlab.experiments.mqar") and isinstance(sweep["seed"], int)
    for r in sweep["points"]:
        point = lab.PointConfig(**{f.name: r[f.name] for f in fields(lab.PointConfig)})
        model = lab.build_model(point)
        assert r["state_size"] == model.state_size(point.seq_len), (r["architecture"], r["d_model"])
        assert r["parameters"] == sum(p.numel() for p in model.parameters())
        assert r["steps_run"] == r["curve"]["step"][-1] <= point.steps
        assert abs(r["accuracy"] - max(r["curve"]["accuracy"])) < 1e-4 and 0 <= r["accuracy"] <= 1
        assert r["solved"] == (r["accuracy"] >= point.solved_at)
    if name == lab.DATA_FILE:
        grid = {(p.architecture, p.d_model) for p in lab.sweep_points()}
        assert {(r["architecture"], r["d_model"]) for r in sweep["points"]} == grid
