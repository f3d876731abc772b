"""Chapter 3's trained experiments: the pre-LN and post-LN blocks are what they say, the sweeps
record what they trained, the shipped results match the code that made them, and the
power-law fit recovers a planted exponent."""
import json
import math
from dataclasses import fields

import pytest
import torch

from attnlab.blocks import LayerNorm, TransformerBlock
from attnlab.experiments import prepost
from attnlab.experiments import scaling_sweep as scaling


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_pre_and_post_ln_blocks_are_what_they_say(norm):
    torch.manual_seed(0)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    for position in ("pre", "post"):
        block = TransformerBlock(16, 4, norm_position=position, norm=norm).double()
        with torch.no_grad():                               # non-trivial norms, so LN ≠ identity
            for p in (block.norm1.weight, block.norm2.weight):
                p.normal_()
        attn = lambda h: block.attn(h, causal=True)
        if position == "pre":                               # x + f(LN(x)), twice
            h = x + attn(block.norm1(x))
            expected = h + block.ffn(block.norm2(h))
        else:                                               # LN(x + f(x)), twice
            h = block.norm1(x + attn(x))
            expected = block.norm2(h + block.ffn(h))
        assert torch.allclose(block(x, causal=True), expected, atol=1e-12), position


def test_post_ln_output_is_normalised_and_pre_ln_is_not():
    torch.manual_seed(0)
    x = 5 * torch.randn(3, 6, 32)
    post = TransformerBlock(32, 4, norm_position="post")(x, causal=True)
    pre = TransformerBlock(32, 4, norm_position="pre")(x, causal=True)
    assert torch.allclose(post.mean(-1), torch.zeros(3, 6), atol=1e-5)
    assert torch.allclose(post.var(-1, unbiased=False), torch.ones(3, 6), atol=1e-3)
    assert pre.var(-1, unbiased=False).mean() > 10                 # the residual stream keeps x's scale


def test_char_transformer_wiring():
    model = prepost.CharTransformer(vocab=11, d_model=16, n_layers=3, n_heads=4, norm_position="pre", max_len=9)
    assert isinstance(model.norm_f, LayerNorm) and len(model.blocks) == 3
    assert all(b.norm_position == "pre" for b in model.blocks)
    post = prepost.CharTransformer(11, 16, 3, 4, "post", max_len=9)
    assert isinstance(post.norm_f, torch.nn.Identity) and all(b.norm_position == "post" for b in post.blocks)
    idx = torch.randint(0, 11, (2, 9))
    changed = idx.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 11
    for m in (model, post):
        assert m(idx).shape == (2, 9, 11)
        assert torch.equal(m(idx)[:, :5], m(changed)[:, :5])          # causal


def test_splits_are_disjoint_and_cover_the_corpus():
    s = prepost.splits()
    from attnlab.tasks import char_corpus
    corpus = char_corpus()
    assert len(s["train"]) + len(s["val"]) + len(s["test"]) == len(corpus.text)
    assert torch.equal(torch.cat([s["train"], s["val"], s["test"]]), torch.cat([corpus.train_ids, corpus.val_ids]))
    assert 0 < s["unigram_entropy"] < math.log(s["vocab"])


def test_run_point_records_its_run():
    point = prepost.PointConfig("post", 2, 3, 1e-3, steps=6, eval_every=3, eval_windows=4, batch=2, seq_len=8)
    r = prepost.run_point(point)
    assert len(r["loss"]) == len(r["grad_norm"]) == 6 and r["initial_loss"] == r["loss"][0]
    assert sorted(map(int, r["block_grad_norms"])) == [s for s in prepost.GRAD_STEPS if s <= 6]
    assert all(len(v) == 2 for v in r["block_grad_norms"].values())
    assert [e["step"] for e in r["evals"]] == [3, 6] and r["arm"] == "post-LN, 2 layers, warmup 3"
    assert r["diverged"] == (r["final_train_loss"] > r["initial_loss"])
    json.dumps(r)


def test_a_run_that_blows_up_is_marked_diverged():
    point = prepost.PointConfig("post", 2, 0, 1e6, steps=30, eval_every=10, eval_windows=4, batch=2, seq_len=8)
    r = prepost.run_point(point)
    assert r["diverged"]


def test_summary_picks_each_arms_rate_on_validation():
    def run(lr, seed, val, test, diverged=False):
        return {"arm": "a", "norm_position": "pre", "n_layers": 6, "warmup": 0, "lr": lr, "seed": seed,
                "val_loss": None if diverged else val, "test_loss": None if diverged else test, "diverged": diverged}

    points = [run(1e-3, 0, 2.0, 2.1), run(1e-3, 1, 2.2, 2.3),            # mean val 2.1
              run(3e-3, 0, 1.0, 1.1), run(3e-3, 1, 1.0, 1.2, diverged=True)]   # one diverged: +inf
    (row,) = prepost.summarise(points)
    assert row["best_lr"] == 1e-3 and row["diverged"] == {1e-3: 0, 3e-3: 1}
    assert abs(row["test_mean"] - 2.2) < 1e-12 and abs(row["test_sd"] - math.sqrt(0.02)) < 1e-12


def test_sweep_writes_after_each_point_and_resumes(tmp_path, monkeypatch):
    ran = []

    def fake_run(point, progress=False):
        ran.append(prepost._key(point))
        return {"norm_position": point.norm_position, "n_layers": point.n_layers, "warmup": point.warmup,
                "lr": point.lr, "seed": point.seed}

    monkeypatch.setattr(prepost, "run_point", fake_run)
    out = tmp_path / "sweep.json"
    prepost.run_sweep(prepost.sweep_points(depths=(6,), lrs=(1e-3,), seeds=(0,)), out, progress=False, command="t")
    assert json.loads(out.read_text())["command"] == "t" and len(ran) == 4       # 2 norms × 2 warmups
    result = prepost.run_sweep(prepost.sweep_points(depths=(6,), lrs=(1e-3,), seeds=(0, 1)), out, resume=True,
                               progress=False)
    assert len(ran) == 8 and len(result["points"]) == 8                 # only the new seed ran


def test_shipped_prepost_sweep_matches_the_code_that_made_it():
    sweep = prepost.load_sweep()
    assert sweep["command"].startswith("python -m attnlab.experiments.prepost")
    assert sweep["seeds"] == list(prepost.SEEDS) and abs(sweep["unigram_entropy"] - prepost.splits()["unigram_entropy"]) < 1e-3
    grid = {prepost._key(p) for p in prepost.sweep_points()}
    assert {prepost._key(r) for r in sweep["points"]} == grid
    vocab = prepost.splits()["vocab"]
    sizes = {}
    for r in sweep["points"]:
        point = prepost.PointConfig(**{f.name: (tuple(r[f.name]) if f.name == "betas" else r[f.name])
                                       for f in fields(prepost.PointConfig)})
        assert point == prepost.PointConfig(point.norm_position, point.n_layers, point.warmup, point.lr, point.seed)
        assert r["arm"] == point.arm
        key = (point.norm_position, point.n_layers)
        if key not in sizes:
            sizes[key] = sum(p.numel() for p in prepost.build_model(point, vocab).parameters())
        assert r["parameters"] == sizes[key]
        steps_run = len(r["loss"])
        assert steps_run == point.steps or r["nonfinite_at"] == steps_run
        assert r["initial_loss"] == r["loss"][0]
        assert all(len(v) == point.n_layers for v in r["block_grad_norms"].values())
        finite = [v for v in r["loss"] if v is not None]
        if r["nonfinite_at"] is None:
            assert abs(r["final_train_loss"] - sum(finite[-20:]) / 20) < 1e-3
            assert r["diverged"] == (r["final_train_loss"] > r["initial_loss"])
        else:
            assert r["diverged"] and r["val_loss"] is None


def test_scaling_model_counts_non_embedding_parameters():
    point = scaling.PointConfig(d_model=16, lr=1e-3)
    model = scaling.build_model(point, vocab=50)
    d, L = 16, point.n_layers
    assert scaling.non_embedding_parameters(model) == L * (12 * d * d + 13 * d) + 2 * d
    assert sum(p.numel() for p in model.parameters()) == scaling.non_embedding_parameters(model) + (50 + 32) * d


def test_shipped_scaling_sweep_matches_the_code_that_made_it():
    sweep = scaling.load_sweep()
    assert sweep["command"].startswith("python -m attnlab.experiments.scaling_sweep")
    assert {scaling._key(r) for r in sweep["points"]} == {scaling._key(p) for p in scaling.sweep_points()}
    vocab = prepost.splits()["vocab"]
    for r in sweep["points"]:
        point = scaling.PointConfig(**{f.name: r[f.name] for f in fields(scaling.PointConfig)})
        model = scaling.build_model(point, vocab)
        assert r["non_embedding_parameters"] == scaling.non_embedding_parameters(model)
        assert r["parameters"] == sum(p.numel() for p in model.parameters()) and r["tokens"] == point.tokens


@pytest.mark.parametrize("E, A, alpha", [(0.0, 5.0, 0.076), (1.2, 30.0, 0.4), (2.5, 8.0, 0.25)])
def test_power_law_fit_recovers_a_planted_exponent(E, A, alpha):
    n = torch.logspace(3, 6, 6, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    loss = (E + A * n ** -alpha) * (1 + 1e-4 * torch.randn(6, generator=g, dtype=torch.float64))
    fit = scaling.fit_power_law(n, loss, irreducible=E > 0)
    assert abs(fit["alpha"] - alpha) < 0.02 * alpha + 0.005, fit
    assert abs(fit["E"] - E) < 0.02 + 0.02 * E


def test_power_law_fit_without_noise_is_exact_and_names_bad_input():
    n = torch.tensor([1e3, 1e4, 1e5, 1e6], dtype=torch.float64)
    fit = scaling.fit_power_law(n, (8.8e13 / n) ** 0.076, irreducible=False)
    assert abs(fit["alpha"] - 0.076) < 1e-9 and abs(fit["N_c"] / 8.8e13 - 1) < 1e-6
    with pytest.raises(ValueError, match="k >= 3"):
        scaling.fit_power_law([1.0, 2.0], [1.0, 0.5])
