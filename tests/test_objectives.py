"""MLM corruption (15%, 80/10/10) and T5 span corruption, against their papers' definitions."""
import pytest
import torch

from attnlab.attention import uniform_entropy
from attnlab.objectives import mlm_corrupt, random_spans, span_corrupt

SENTENCE = "Thank you for inviting me to your party last week.".split()


def test_mlm_rates_are_15_percent_and_80_10_10():
    ids = torch.randint(1, 1000, (200, 500), generator=torch.Generator().manual_seed(0))
    inputs, targets = mlm_corrupt(ids, vocab_size=1000, mask_id=0, generator=torch.Generator().manual_seed(1))
    selected = targets != -100
    assert selected.float().mean().item() == pytest.approx(0.15, abs=0.003)
    assert torch.equal(targets[selected], ids[selected]) and torch.equal(inputs[~selected], ids[~selected])
    masked = (inputs == 0)[selected].float().mean().item()
    unchanged = (inputs == ids)[selected].float().mean().item()
    assert masked == pytest.approx(0.8, abs=0.01)
    assert unchanged == pytest.approx(0.1 + 0.1 / 1000, abs=0.01)  # a random draw may hit the original id
    assert 1 - masked - unchanged == pytest.approx(0.1, abs=0.01)


def test_span_corruption_reproduces_the_lectures_example():
    inputs, targets = span_corrupt(SENTENCE, [(3, 1), (8, 1)], ["<X>", "<Y>", "<Z>"])
    assert " ".join(inputs) == "Thank you for <X> me to your party <Y> week."
    assert " ".join(targets) == "<X> inviting <Y> last <Z>"


def test_span_corruption_reproduces_the_t5_papers_figure():
    inputs, targets = span_corrupt(SENTENCE, [(2, 2), (8, 1)], ["<X>", "<Y>", "<Z>"])
    assert " ".join(inputs) == "Thank you <X> me to your party <Y> week."
    assert " ".join(targets) == "<X> for inviting <Y> last <Z>"


def test_span_corruption_is_invertible():
    tokens = [str(i) for i in range(40)]
    for seed in range(20):
        spans = random_spans(40, generator=torch.Generator().manual_seed(seed))
        inputs, targets = span_corrupt(tokens, spans)
        assert sum(length for _, length in spans) == 6 and len(spans) == 2
        pieces, current = {}, None
        for t in targets:
            if t.startswith("<extra_id_"):
                current = t
                pieces[current] = []
            else:
                pieces[current].append(t)
        restored = []
        for t in inputs:
            restored += pieces[t] if t in pieces else [t]
        assert restored == tokens


def test_span_corruption_rejects_bad_spans():
    with pytest.raises(ValueError, match="span 1 is"):
        span_corrupt(SENTENCE, [(3, 2), (4, 1)])
    with pytest.raises(ValueError, match="sentinels"):
        span_corrupt(SENTENCE, [(3, 1)], ["<X>"])


def test_causal_uniform_entropy_baseline():
    h = uniform_entropy(128)
    assert h[0] == 0 and h[-1].item() == pytest.approx(4.852, abs=1e-3)
    assert h.mean().item() == pytest.approx(3.878, abs=1e-3)
    assert torch.allclose(uniform_entropy(5, causal=False), torch.full((5,), 5.0, dtype=torch.float64).log())
