"""The differential-attention ablation: its arms, its protocol, and the shipped results file."""
import json

import pytest
import torch

from attnlab.diff_attention import DifferentialAttention
from attnlab.experiments import diff_ablation as da


def test_arms_build_the_models_they_name():
    point = da.PointConfig(arm="standard-4", lr=1e-2, n_pairs=8, n_keys=16, group_size=4)
    counts = {}
    for arm in da.ARMS:
        model = da.build_model(da.PointConfig(**{**point.__dict__, "arm": arm}))
        counts[arm] = sum(p.numel() for p in model.attn.parameters())
        if arm.startswith("standard"):
            assert model.attn.n_heads == int(arm[-1])
        else:
            assert isinstance(model.attn, DifferentialAttention) and model.attn.n_heads == 2
            assert model.attn.lambda_mode == {"diff-zero": "zero", "diff-fixed": "fixed",
                                              "diff-learned": "learned"}[arm]
    # the same projections everywhere; the differential layer adds the λ vectors and the norm gain
    assert counts["standard-4"] == counts["standard-2"]
    assert counts["diff-learned"] == counts["standard-4"] + 4 * 16 + 2 * 16
    with pytest.raises(ValueError, match="arm"):
        da.build_model(da.PointConfig(arm="linear", lr=1e-2))


def test_a_point_trains_and_records_lambda():
    small = dict(n_pairs=8, n_keys=16, group_size=4, steps=6, record_every=2, n_val=16, n_test=16,
                 d_model=16, batch=8)
    learned = da.run_point(da.PointConfig(arm="diff-learned", lr=1e-2, **small))
    assert learned["lambda_steps"] == [0, 2, 4, 6] and len(learned["lambda"]) == 4
    assert learned["lambda"][0] != learned["lambda"][-1]                 # λ moves when learned
    fixed = da.run_point(da.PointConfig(arm="diff-fixed", lr=1e-2, **small))
    assert all(v == pytest.approx(0.2) for v in fixed["lambda"])
    standard = da.run_point(da.PointConfig(arm="standard-2", lr=1e-2, **small))
    assert "lambda" not in standard
    for r in (learned, fixed, standard):
        assert set(r["test"]) == {"accuracy", "loss", "target_share", "best_head_share", "entropy"}
        assert 0 <= r["test"]["target_share"] <= 1


def test_selection_uses_validation_and_reports_test():
    def point(arm, lr, seed, val, test):
        return {"arm": arm, "lr": lr, "seed": seed, "val": {"loss": val},
                "test": {"accuracy": test, "loss": 1 - test, "target_share": test,
                         "best_head_share": test, "entropy": 0.0}}
    points = [point("standard-4", 1e-2, s, 0.5, 0.9) for s in range(3)] + \
             [point("standard-4", 3e-3, s, 0.4, 0.1 * s) for s in range(3)]
    (row,) = da.summarise(points)
    assert row["best_lr"] == 3e-3                                        # lower validation loss wins
    assert row["accuracy"] == [0.0, 0.1, 0.2] and row["accuracy_mean"] == pytest.approx(0.1)
    assert row["accuracy_sd"] == pytest.approx(0.1)
    assert row["loss"] == pytest.approx([1.0, 0.9, 0.8])                # the primary outcome
    assert row["best_head_share"] == [0.0, 0.1, 0.2]


def test_resume_skips_finished_points(tmp_path, monkeypatch):
    calls = []

    def fake(point):
        calls.append(point)
        return {"arm": point.arm, "lr": point.lr, "seed": point.seed}

    monkeypatch.setattr(da, "run_point", fake)
    points = da.sweep_points(arms=("diff-zero",), lrs=(1e-2,), seeds=(0, 1))
    out = tmp_path / "d.json"
    da.run_sweep(points[:1], out, progress=False, command="c")
    da.run_sweep(points, out, resume=True, progress=False, command="c")
    assert [p.seed for p in calls] == [0, 1]
    assert len(json.loads(out.read_text())["points"]) == 2


def test_shipped_results():
    data = da.load_sweep()
    assert data["command"] == "python -m attnlab.experiments.diff_ablation"
    points = data["points"]
    assert len(points) == len(da.ARMS) * len(da.LRS) * len(da.SEEDS)
    for arm in da.ARMS:                                                  # one grid for every arm
        assert sorted((p["lr"], p["seed"]) for p in points if p["arm"] == arm) == \
            sorted((lr, s) for lr in da.LRS for s in da.SEEDS)
    for p in points:
        if p["arm"] == "diff-learned":
            assert len(p["lambda"]) == len(p["lambda_steps"]) == p["steps"] // p["record_every"] + 1
    rows = da.summarise(points)
    assert [r["arm"] for r in rows] == list(da.ARMS)
    assert all(len(r["accuracy"]) == 3 for r in rows)
