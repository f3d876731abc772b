"""attnlab.experiments.microgpt: the shipped target and draft models, the resumable trainer, and the
ladder of chapter 4 (counted bigram, three learned models x rates x seeds)."""
import math
import re
from dataclasses import asdict

import pytest
import torch

from attnlab.experiments import microgpt
from attnlab.models import generate
from attnlab.tasks import char_corpus, clean_markup, python_docs_text


@pytest.fixture(scope="module")
def shipped():
    return {size: microgpt.load_pretrained(size) for size in ("target", "draft")}


def test_shipped_models_read_the_frozen_cleaned_corpus(shipped):
    for size, (model, data) in shipped.items():
        assert data.chars == char_corpus(clean=True).chars
        assert data.text == clean_markup(python_docs_text())
        assert model.config.vocab_size == data.vocab_size and not model.training
        assert model.tok_emb.weight.dtype == torch.float32
        assert model.lm_head.weight is model.tok_emb.weight          # tied after loading


def test_target_reaches_1_5_nats_and_is_better_than_the_smaller_draft(shipped):
    (target, data), (draft, _) = shipped["target"], shipped["draft"]
    x, y = microgpt.validation_windows(data, microgpt.SIZES["target"])
    losses = {size: microgpt.evaluate(m, x, y)["val_loss"] for size, (m, _) in shipped.items()}
    assert losses["target"] <= 1.5
    assert losses["draft"] > losses["target"] + 0.05
    assert losses["draft"] < 2.0                                   # far below the bigram floor (~2.5)
    n = lambda m: sum(p.numel() for p in m.parameters())
    assert n(draft) * 4 < n(target) and draft.config.n_layers < target.config.n_layers
    for size in ("target", "draft"):
        log = microgpt.load_log(size)
        assert log["command"].startswith("python -m attnlab.experiments.microgpt")
        assert log["run"] == asdict(microgpt.SIZES[size])           # the shipped file matches SIZES
        assert abs(log["final_val_loss"] - losses[size]) < 0.01    # fp16 storage changes little


def test_shipped_models_write_words(shipped):
    model, data = shipped["target"]
    ids = generate(model, data.encode("The ").unsqueeze(0), 200, use_cache=False, temperature=0.8,
                   top_k=10, generator=torch.Generator().manual_seed(0))
    words = data.decode(ids[0]).split()
    common = {"the", "a", "of", "is", "to", "and", "in", "be", "an", "if", "that", "for", "or"}
    assert sum(w.strip('.,;:"()') in common for w in words) >= 5


def test_draft_writes_mostly_words_of_the_training_text(shipped):
    draft, data = shipped["draft"]
    known = set(re.findall(r"[A-Za-z]+", data.decode(data.train_ids)))
    prompt = data.encode("The value of the ").unsqueeze(0).repeat(4, 1)
    ids = generate(draft, prompt, 200, use_cache=False, temperature=0.8, top_k=10,
                   generator=torch.Generator().manual_seed(0))
    words = [w for row in ids for w in re.findall(r"[A-Za-z]+", data.decode(row[prompt.shape[1]:]))]
    assert sum(w in known for w in words) / len(words) > 0.7


def test_word_shares_counts_words_and_adjacent_pairs_of_the_training_text():
    vocabulary = ({"the", "value", "of"}, {("value", "of"), ("of", "the")})
    shares = microgpt.word_shares(["he value of the valu", "x of zz the x"], vocabulary)
    # words: value of the | of zz the (first and last words dropped); pairs: 2 + 2
    assert shares["words"] == 6 and shares["real words"] == 5 / 6
    assert shares["word pairs"] == 4 and shares["pairs of the manual"] == 2 / 4
    with pytest.raises(ValueError, match="no word pair"):
        microgpt.word_shares(["the value of"], vocabulary)


def test_target_uses_the_manuals_word_pairs_more_often_than_the_draft(shipped):
    """Both write mostly real words (the draft about nine in ten at T = 0.8); the target's adjacent
    word pairs occur in the training text more often, in each of three seeds. Other samples than
    chapter 14's: 32 per model and seed, from four prompts."""
    data = shipped["target"][1]
    vocabulary = microgpt.training_vocabulary(data)
    prompts = torch.stack([data.encode(p) for p in ("The ", "If t", "A cl", "This")]).repeat(8, 1)
    for seed in (1, 2, 3):
        shares = {}
        for size, (model, _) in shipped.items():
            ids = generate(model, prompts, 56, temperature=0.8, generator=torch.Generator().manual_seed(seed))
            shares[size] = microgpt.word_shares([data.decode(row) for row in ids], vocabulary)
        assert shares["target"]["real words"] > 0.95 and shares["draft"]["real words"] > 0.8
        assert shares["target"]["pairs of the manual"] > shares["draft"]["pairs of the manual"], (seed, shares)


def test_entropy_log_has_one_value_per_layer(shipped):
    log = microgpt.load_log("target")["log"]
    layers = shipped["target"][0].config.n_layers
    assert log["evals"][0]["step"] == 0 and all(len(e["layer_entropy"]) == layers for e in log["evals"])
    first = log["evals"][0]["layer_entropy"]
    baseline = sum(math.log(i) for i in range(1, 65)) / 64
    assert all(abs(v - baseline) < 0.05 for v in first)             # untrained: the causal baseline


def test_training_resumes_exactly_where_it_stopped(tmp_path):
    run = microgpt.RunConfig(n_layers=1, d_model=16, n_heads=2, max_len=16, batch=4, steps=6,
                             warmup=2, eval_every=3, eval_windows=4)
    whole, log_whole = microgpt.train_size("t", run, work=tmp_path / "a", progress=False)
    microgpt.train_size("t", run, work=tmp_path / "b", stop_after=4, progress=False)
    resumed, log_resumed = microgpt.train_size("t", run, work=tmp_path / "b", resume=True, progress=False)
    assert log_whole["train_loss"] == log_resumed["train_loss"] and len(log_whole["train_loss"]) == 6
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    other = microgpt.RunConfig(**{**asdict(run), "lr": 1e-4})
    with pytest.raises(ValueError, match="resume"):
        microgpt.train_size("t", other, work=tmp_path / "b", resume=True, progress=False)


def test_save_and_load_round_trip(tmp_path):
    run = microgpt.RunConfig(n_layers=1, d_model=16, n_heads=2, max_len=16, batch=4, steps=2,
                             warmup=1, eval_every=1, eval_windows=4)
    model, log = microgpt.train_size("draft", run, work=tmp_path, progress=False)
    microgpt.save_pretrained("draft", model, microgpt.corpus(), run, log, "test", tmp_path)
    loaded, _ = microgpt.load_pretrained("draft", directory=tmp_path)
    idx = torch.randint(0, loaded.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert (loaded(idx) - model(idx)).abs().max() < 0.05           # fp16 weights
    with pytest.raises(ValueError, match="size"):
        microgpt.load_pretrained("huge")


# ------------------------------------------------------------------------------------ the ladder

def test_count_bigram_is_add_alpha_smoothed_counts():
    ids = torch.tensor([0, 1, 0, 1, 0, 2])
    logp = microgpt.count_bigram(ids, 3, 0.5)
    assert torch.allclose(logp.exp().sum(1), torch.ones(3, dtype=torch.float64))
    assert abs(logp[0, 1].exp().item() - (2 + 0.5) / (3 + 1.5)) < 1e-12   # 0 -> 1 twice, 0 -> 2 once
    assert abs(logp[2, 0].exp().item() - 1 / 3) < 1e-12                   # a row never seen: uniform
    with pytest.raises(ValueError, match="alpha"):
        microgpt.count_bigram(ids, 3, 0.0)


def test_windows_cover_the_text_with_next_character_targets():
    ids = torch.arange(10)
    x, y = microgpt.windows(ids, 3)
    assert x.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]] and torch.equal(y, x + 1)
    with pytest.raises(ValueError, match="length"):
        microgpt.windows(ids[:3], 3)


def test_ladder_splits_cut_the_validation_text_in_two():
    data = microgpt.corpus()
    s = microgpt.ladder_splits(data)
    assert torch.equal(torch.cat([s["selection"], s["test"]]), data.val_ids)
    assert abs(len(s["selection"]) - len(s["test"])) <= 1 and torch.equal(s["train"], data.train_ids)


def test_ladder_models_and_bad_names():
    point = microgpt.LadderPoint("one head", 1e-2, 0)
    for name in microgpt.LADDER_MODELS:
        model = microgpt.ladder_model(name, 103, point)
        assert model(torch.zeros(2, point.length, dtype=torch.long)).shape == (2, point.length, 103)
    with pytest.raises(ValueError, match="name"):
        microgpt.ladder_model("three heads", 103, point)


def test_ladder_runs_and_resumes(tmp_path):
    points = [microgpt.LadderPoint(m, 1e-2, 0, steps=3, warmup=1, d_model=16) for m in microgpt.LADDER_MODELS[:2]]
    out = tmp_path / "ladder.json"
    microgpt.run_ladder(out, points=points[:1], progress=False)
    data = microgpt.run_ladder(out, points=points, resume=True, progress=False)
    assert [p["model"] for p in data["points"]] == list(microgpt.LADDER_MODELS[:2])
    again = microgpt.run_ladder(out, points=points, resume=True, progress=False)   # nothing left to run
    assert again["points"] == data["points"]
    assert data["command"] == "python -m attnlab.experiments.microgpt --ladder"
    assert all(math.isfinite(p["test_loss"]) and p["test_loss"] < 5 for p in data["points"])


def test_shipped_ladder_is_complete_and_selected_on_the_selection_half():
    ladder = microgpt.load_ladder()
    assert ladder["command"] == "python -m attnlab.experiments.microgpt --ladder"
    key = lambda p: (p["model"], p["lr"], p["seed"])
    assert sorted(map(key, ladder["points"])) == sorted(
        (p.model, p.lr, p.seed) for p in microgpt.ladder_points())
    assert all(p["steps"] == microgpt.LadderPoint("x", 0, 0).steps for p in ladder["points"])
    bigram = microgpt.bigram_results(microgpt.corpus())
    assert ladder["bigram"]["alpha"] == bigram["alpha"]
    assert abs(ladder["bigram"]["test_loss"] - bigram["test_loss"]) < 1e-9
    for row in microgpt.ladder_summary(ladder):
        assert row["selection_by_lr"][row["lr"]] == min(row["selection_by_lr"].values())
        assert row["seeds"] == 3 and row["test_min"] <= row["test_mean"] <= row["test_max"]


def test_ladder_point_is_reproducible():
    point = microgpt.LadderPoint("MicroGPT, 1 layer", 1e-2, 1, steps=4, warmup=1, d_model=16)
    a, b = microgpt.run_ladder_point(point), microgpt.run_ladder_point(point)
    assert a["test_loss"] == b["test_loss"] and a["train_curve"] == b["train_curve"]
