"""Chapter 02's trained comparison: the repeat task is what it claims to be, every positional
scheme's model is causal, RoPE and ALiBi scores depend only on relative position, learned rows
past the training length are never trained, and the shipped sweep matches the code."""
import json
from dataclasses import fields

import pytest
import torch

from attnlab.experiments import positions as lab
from attnlab.position_models import SCHEMES, PositionalAttention, PositionConfig, PositionLM


@pytest.mark.parametrize("segment", [2, 5, 16, 64])
def test_repeat_task_repeats_distinct_tokens_and_scores_the_predictable_part(segment):
    b = lab.repeat_task(6, segment, vocab=128, seed=segment)
    assert b.inputs.shape == b.targets.shape == (6, 2 * segment)
    assert bool((b.inputs[:, 0] == lab.BOS).all()) and bool((b.inputs[:, 1:] != lab.BOS).all())
    first, second = b.inputs[:, 1:segment + 1], b.inputs[:, segment + 1:]
    assert torch.equal(first[:, :-1], second)
    assert all(len(set(row.tolist())) == segment for row in first)
    scored = b.scored[0].nonzero().flatten().tolist()
    assert scored == list(range(segment + 1, 2 * segment))              # the repeat's x_1 … x_{L-1}
    assert torch.equal(b.targets[:, scored], first[:, 1:])               # predict x_2 … x_L
    assert bool(b.scored.sum(-1).eq(segment - 1).all())


def test_repeat_task_is_seeded_and_checks_its_input():
    assert torch.equal(lab.repeat_task(3, 8, seed=1).inputs, lab.repeat_task(3, 8, seed=1).inputs)
    assert not torch.equal(lab.repeat_task(3, 8, seed=1).inputs, lab.repeat_task(3, 8, seed=2).inputs)
    with pytest.raises(ValueError, match="segment must be between 2 and vocab - 1 = 7"):
        lab.repeat_task(2, 8, vocab=8)


def test_training_batches_vary_the_segment_within_the_training_range():
    point = lab.PointConfig("rope", 1e-3)
    lengths = {lab.training_batch(point, step).inputs.shape[1] for step in range(1, 200)}
    assert lengths == set(range(2 * point.min_segment, point.train_len + 1, 2))


class Copier(torch.nn.Module):
    """Solves the repeat task by lookup: predicts the token that followed the current one earlier."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, tokens):
        logits = torch.zeros(*tokens.shape, self.vocab)
        for row in range(tokens.shape[0]):
            seen = {}
            for i, token in enumerate(tokens[row].tolist()):
                if token in seen and seen[token] + 1 < tokens.shape[1]:
                    logits[row, i, tokens[row, seen[token] + 1]] = 1.0
                seen.setdefault(token, i)
        return logits


def test_accuracy_is_one_for_the_induction_algorithm_and_zero_for_a_constant():
    for segment in (4, 16, 64):
        b = lab.repeat_task(8, segment, seed=3)
        assert lab.repeat_accuracy(Copier(128), b) == 1.0
    assert lab.repeat_accuracy(lambda t: torch.zeros(*t.shape, 128), lab.repeat_task(8, 16, seed=3)) <= 8 / 120


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_gives_a_causal_model(scheme):
    torch.manual_seed(0)
    model = PositionLM(PositionConfig(vocab=32, scheme=scheme, max_len=24)).double().eval()
    tokens = torch.randint(0, 32, (2, 20))
    changed = tokens.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % 32
    with torch.no_grad():
        assert torch.equal(model(tokens)[:, :12], model(changed)[:, :12])
        assert not torch.allclose(model(tokens)[:, 12:], model(changed)[:, 12:])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_only_the_absolute_schemes_touch_the_embeddings(scheme):
    model = PositionLM(PositionConfig(vocab=16, scheme=scheme, max_len=8))
    idx = torch.arange(8).view(1, 8) % 16
    same = torch.equal(model.embed(idx), model.tok_emb(idx))
    assert same == (scheme in ("none", "rope", "alibi"))


def test_rope_and_alibi_scores_depend_only_on_relative_position():
    torch.manual_seed(1)
    x = torch.randn(1, 1, 32, dtype=torch.float64).expand(1, 24, 32)    # the same content at every position
    for scheme in ("rope", "alibi", "none"):
        s = PositionalAttention(32, 4, scheme).double().scores(x)[0]     # (h, L, L)
        for offset in range(-23, 24):
            diagonal = s.diagonal(offset, dim1=-2, dim2=-1)
            assert torch.allclose(diagonal, diagonal[..., :1].expand_as(diagonal), atol=1e-10), (scheme, offset)
    # with content, RoPE's score is unchanged when query and key positions move together
    q, k = torch.randn(2, 1, 1, 8, dtype=torch.float64)
    from attnlab.positional import apply_rope
    score = lambda i, j: (apply_rope(q, [i]) @ apply_rope(k, [j]).transpose(-2, -1)).item()
    assert abs(score(7, 3) - score(107, 103)) < 1e-10 and abs(score(7, 3) - score(3, 7)) > 1e-3


def test_absolute_schemes_are_not_relative():
    torch.manual_seed(1)
    model = PositionLM(PositionConfig(vocab=4, scheme="sinusoidal", max_len=24)).double()
    x = model.embed(torch.zeros(1, 24, dtype=torch.long))
    s = model.blocks[0].attn.scores(model.blocks[0].norm1(x))[0]
    diagonal = s.diagonal(-3, dim1=-2, dim2=-1)
    assert not torch.allclose(diagonal, diagonal[..., :1].expand_as(diagonal), atol=1e-3)


def test_learned_rows_past_the_training_length_get_no_gradient():
    point = lab.PointConfig("learned", 3e-3, steps=5, eval_every=5, eval_size=4, test_size=4, batch=4, warmup=1)
    torch.manual_seed(point.seed)
    initial = lab.build_model(point).pos_emb.weight.detach().clone()
    result, model = lab.run_point(point, return_model=True)
    after = model.pos_emb.weight.detach()
    assert after.shape == (4 * point.train_len, point.d_model)
    assert torch.equal(after[point.train_len:], initial[point.train_len:])          # never trained
    assert not torch.equal(after[:point.train_len], initial[:point.train_len])
    assert result["row_norm"]["untrained"] == round(initial[point.train_len:].norm(dim=-1).mean().item(), 4)


def test_run_point_records_its_run():
    point = lab.PointConfig("alibi", 3e-3, steps=4, eval_every=2, eval_size=8, test_size=8, batch=4, warmup=1)
    result = lab.run_point(point)
    assert result["curve"]["step"] == [2, 4] and result["val_accuracy"] == result["curve"]["accuracy"][-1]
    assert list(result["test_accuracy"]) == ["32", "64", "128"]
    assert result["parameters"] == sum(p.numel() for p in lab.build_model(point).parameters())
    json.dumps(result)


def test_sweep_writes_after_each_point_and_resumes(tmp_path, monkeypatch):
    ran = []

    def fake_run(point, progress=False):
        ran.append(lab._key(point))
        return {"scheme": point.scheme, "lr": point.lr, "seed": point.seed, "val_accuracy": 0.5}

    monkeypatch.setattr(lab, "run_point", fake_run)
    out = tmp_path / "sweep.json"
    lab.run_sweep(lab.sweep_points(("rope",), (1e-3,), (0, 1)), out, progress=False, command="test")
    assert json.loads(out.read_text())["command"] == "test" and len(ran) == 2
    result = lab.run_sweep(lab.sweep_points(("rope", "alibi"), (1e-3,), (0, 1)), out, resume=True, progress=False)
    assert sorted(ran[2:]) == [("alibi", 1e-3, 0), ("alibi", 1e-3, 1)]               # only the new runs
    assert [lab._key(r) for r in result["points"]] == [
        ("rope", 1e-3, 0), ("rope", 1e-3, 1), ("alibi", 1e-3, 0), ("alibi", 1e-3, 1)]


def test_learning_rates_are_chosen_on_validation_not_test():
    points = [{"scheme": "rope", "lr": lr, "seed": s, "val_accuracy": val, "test_accuracy": {"32": test}}
              for lr, val, test in [(1e-3, 0.9, 0.1), (1e-2, 0.5, 0.9)] for s in (0, 1)]
    assert lab.best_learning_rates(points) == {"rope": 1e-3}
    (row,) = lab.summarise(points)
    assert row["lr"] == 1e-3 and row["32"]["mean"] == pytest.approx(0.1) and row["seeds"] == 2


def test_shipped_sweep_matches_the_code_that_made_it():
    sweep = lab.load_sweep()
    assert sweep["command"].startswith("python -m attnlab.experiments.positions")
    assert len(sweep["seeds"]) >= 3 and len(sweep["learning_rates"]) >= 3
    grid = {lab._key(p) for p in lab.sweep_points(seeds=sweep["seeds"], lrs=sweep["learning_rates"])}
    assert {lab._key(r) for r in sweep["points"]} == grid                      # every scheme on the same grid
    for r in sweep["points"]:
        point = lab.point_from_record(r)
        model = lab.build_model(point)
        assert r["parameters"] == sum(p.numel() for p in model.parameters()), lab._key(r)
        assert r["curve"]["step"][-1] == point.steps and r["val_accuracy"] == r["curve"]["accuracy"][-1]
        assert list(r["test_accuracy"]) == [str(n) for n in point.test_lengths]
        assert all(0 <= a <= 1 for a in r["test_accuracy"].values())
        if point.scheme == "learned":                # untrained rows keep their (seeded) initial values
            torch.manual_seed(point.seed)
            rows = lab.build_model(point).pos_emb.weight[point.train_len:]
            assert r["row_norm"]["untrained"] == round(rows.norm(dim=-1).mean().item(), 4)
