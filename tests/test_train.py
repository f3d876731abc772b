"""attnlab.train: the loop trains, schedules, evaluates, stops early, and reports bad input."""
import math

import pytest
import torch

from attnlab.models import GPTConfig, MicroGPT
from attnlab.tasks import char_corpus
from attnlab.train import History, next_token_loss, train


def _corpus():
    return char_corpus(text="the cat sat on the mat. " * 40)


def test_microgpt_learns_a_repeated_sentence():
    corpus = _corpus()
    torch.manual_seed(0)
    model = MicroGPT(GPTConfig(corpus.vocab_size, max_len=16, n_layers=1, d_model=32, n_heads=2))
    g = torch.Generator().manual_seed(0)
    history = train(model, lambda step: corpus.batch(16, 16, generator=g), steps=150, lr=1e-2, warmup=10,
                    progress=False)
    assert history.loss[0] == pytest.approx(math.log(corpus.vocab_size), abs=0.3)
    assert history.loss[-1] < 0.3 * history.loss[0]
    assert not model.training


def test_schedule_warms_up_and_decays_to_the_final_fraction():
    model = torch.nn.Linear(2, 2)
    data = (torch.randn(4, 2), torch.randn(4, 2))
    history = train(model, lambda step: data, steps=20, lr=0.1, warmup=5, final_lr_fraction=0.1, progress=False,
                    loss_fn=lambda m, x, y: (m(x) - y).square().mean())
    assert history.lr[:5] == pytest.approx([0.02, 0.04, 0.06, 0.08, 0.1])
    assert history.lr[-1] == pytest.approx(0.01)
    assert history.steps == list(range(1, 21))


def test_weight_decay_skips_one_dimensional_parameters():
    model = torch.nn.Linear(3, 3)
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.fill_(1.0)
    zero = (torch.zeros(1, 3), torch.zeros(1, 3))
    train(model, lambda step: zero, steps=3, lr=0.1, weight_decay=0.5, progress=False, grad_clip=None,
          loss_fn=lambda m, x, y: 0.0 * m(x).sum())  # zero gradient: only decay moves a parameter
    assert model.weight.lt(1.0).all() and model.bias.eq(1.0).all()


def test_evaluations_and_early_stopping():
    model = torch.nn.Linear(1, 1)
    data = (torch.ones(2, 1), torch.ones(2, 1))
    calls = []

    def eval_fn(m):
        calls.append(m.training)
        return {"metric": float(len(calls))}

    history = train(model, lambda step: data, steps=50, eval_fn=eval_fn, eval_every=10, progress=False,
                    stop_when=lambda e: e["metric"] >= 3, loss_fn=lambda m, x, y: (m(x) - y).square().mean())
    assert history.stopped_early and history.steps[-1] == 30
    assert history.eval_series("metric") == ([10, 20, 30], [1.0, 2.0, 3.0])
    assert calls == [False, False, False]  # evaluated in eval mode


def test_eval_runs_after_the_last_step_even_without_eval_every():
    model = torch.nn.Linear(1, 1)
    data = (torch.ones(2, 1), torch.ones(2, 1))
    history = train(model, lambda step: data, steps=7, eval_fn=lambda m: {"x": 1.0}, progress=False,
                    loss_fn=lambda m, x, y: (m(x) - y).square().mean())
    assert [e["step"] for e in history.evals] == [7] and not history.stopped_early


def test_next_token_loss_ignores_minus_100():
    model = MicroGPT(GPTConfig(5, max_len=4, n_layers=1, d_model=8, n_heads=2))
    x = torch.zeros(1, 4, dtype=torch.long)
    y = torch.tensor([[1, -100, -100, 2]])
    logits = model(x)
    expected = torch.nn.functional.cross_entropy(logits[0, [0, 3]], torch.tensor([1, 2]))
    assert next_token_loss(model, x, y).item() == pytest.approx(expected.item())


def test_bad_arguments_and_divergence():
    model = torch.nn.Linear(1, 1)
    data = (torch.ones(1, 1), torch.ones(1, 1))
    with pytest.raises(ValueError, match="steps must be at least 1, got 0"):
        train(model, lambda s: data, steps=0)
    with pytest.raises(ValueError, match="eval_every must be >= 0"):
        train(model, lambda s: data, steps=1, eval_every=-1)
    with pytest.raises(FloatingPointError, match="loss became nan at step 1"):
        train(model, lambda s: data, steps=1, progress=False, loss_fn=lambda m, x, y: m(x).sum() * float("nan"))


def test_history_is_a_plain_record():
    h = History()
    assert h.loss == [] and h.eval_series("x") == ([], [])


def test_char_corpus_round_trip_batches_and_errors(tmp_path):
    corpus = _corpus()
    assert corpus.decode(corpus.encode("the mat")) == "the mat"
    x, y = corpus.batch(4, 10, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 10) and torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="not in the corpus vocabulary"):
        corpus.encode("dog!")
    with pytest.raises(FileNotFoundError):
        char_corpus(tmp_path / "missing.txt")
    path = tmp_path / "t.txt"
    path.write_text("abcabc", encoding="utf-8")
    assert char_corpus(path).chars == ["a", "b", "c"]


def test_default_corpus_ships_with_python():
    corpus = char_corpus()
    assert corpus.vocab_size > 60 and len(corpus.train_ids) > 100_000
    assert "assert" in corpus.text


def test_default_corpus_is_the_shipped_snapshot():
    from attnlab.tasks import SNAPSHOT_PYTHON, clean_markup, python_docs_text
    text = python_docs_text()
    assert len(text) == 465_126 and char_corpus().text == text
    import platform
    if platform.python_version() == SNAPSHOT_PYTHON:
        assert python_docs_text(source="installed") == text
    with pytest.raises(ValueError, match="source"):
        python_docs_text(source="web")
    cleaned = clean_markup("Title\n=====\n\nSome *text*.\n+---+---+\n| a | b |\n\n\n\nend\n")
    assert cleaned == "Title\n\nSome *text*.\n| a | b |\n\nend\n"
    assert char_corpus(clean=True).text == clean_markup(text)
