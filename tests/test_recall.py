"""The recall lab's helpers: the simplified MQAR as a Zoology batch, a window's recall ceiling, the
shortcut baselines and accuracy by query slot."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from attnlab.experiments.mqar import recall_profile
from attnlab.recall import (
    accuracy_by_slot, as_zoology_batch, expected_mode_accuracy, shortcut_accuracy, shortcut_baselines,
    window_ceiling,
)
from attnlab.tasks import mqar, mqar_zoology


class Oracle(torch.nn.Module):
    """Answers a query right when its pair is among the last ``k`` written, and 0 otherwise."""

    def __init__(self, n_pairs: int, k: int, vocab: int):
        super().__init__()
        self.n_pairs, self.k, self.vocab = n_pairs, k, vocab

    def forward(self, tokens):
        P = self.n_pairs
        keys, values = tokens[:, 0:2 * P:2], tokens[:, 1:2 * P:2]
        match = tokens.unsqueeze(-1) == keys[:, -self.k:].unsqueeze(1)          # (b, L, k)
        answer = torch.where(match.any(-1), (match * values[:, -self.k:].unsqueeze(1)).sum(-1), 0)
        answer[:, :2 * P] = 0                                                      # nothing asked in the pairs
        return torch.nn.functional.one_hot(answer, self.vocab).float()


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 12), st.integers(1, 64), st.integers(0, 10_000))
def test_the_view_asks_each_pair_where_the_simplified_prompt_does(n_pairs, batch, seed):
    simple = mqar(batch, n_pairs, seed=seed)
    view = as_zoology_batch(simple)
    assert view.inputs is simple.inputs and view.targets is simple.targets and view.n_pairs == n_pairs
    positions = view.query_positions()
    assert torch.equal(view.inputs.gather(1, positions), simple.inputs[:, 0:2 * n_pairs:2])     # pair j's key
    assert torch.equal(view.targets.gather(1, positions), simple.inputs[:, 1:2 * n_pairs:2])    # its value
    assert torch.equal(view.answer_positions(), simple.answer_positions())
    assert sorted(view.gaps[0].tolist()) == list(range(1, n_pairs + 1))


@pytest.mark.parametrize("k", [1, 3, 8])
def test_an_oracle_of_the_last_k_pairs_has_the_profile_it_should(k):
    P = 8
    simple = mqar(300, P, seed=4)
    profile = recall_profile(Oracle(P, k, simple.vocab), as_zoology_batch(simple))
    assert profile["pairs_back"]["accuracy"] == [1.0] * k + [0.0] * (P - k)
    assert profile["accuracy"] == k / P
    # Zoology's prompts score the same oracle the same way
    zoo = mqar_zoology(300, P, 64, vocab=128, seed=4)
    assert recall_profile(Oracle(P, k, 128), zoo)["pairs_back"]["accuracy"] == [1.0] * k + [0.0] * (P - k)


def test_a_zoology_batch_passes_through_and_bad_batches_are_refused():
    zoo = mqar_zoology(4, 2, 16, vocab=32)
    assert as_zoology_batch(zoo) is zoo
    with pytest.raises(ValueError, match="every key must be asked once"):
        as_zoology_batch(mqar(4, 4, n_queries=3))
    with pytest.raises(TypeError, match="batch must be an MQARBatch"):
        as_zoology_batch(zoo.inputs)


def test_the_window_ceiling_is_the_counted_share_within_reach():
    # P = 8, w = 8: distances 2(8 + i - j) - 1 for i, j in 0..7; 36 of the 64 pairs within 16 tokens
    assert window_ceiling(8, 8) == 36 / 64 + (28 / 64) / 64
    assert window_ceiling(8, 8, n_layers=1) == 10 / 64 + (54 / 64) / 64
    assert window_ceiling(4, 8) == 1.0                       # the longest distance, 13, is within 16
    simple = mqar(4096, 8, seed=9)
    distance = torch.arange(16, 32, 2) - simple.answer_positions()
    share = (distance <= 16).double().mean().item()
    assert abs(share + (1 - share) / 64 - window_ceiling(8, 8)) < 0.01


def _brute_shortcut(batch, rule):
    """Count by hand, per prompt and query: which values are most frequent, and is the answer one."""
    P = int(batch.query_mask[0].nonzero()[0]) // 2
    out = []
    for row in batch.inputs.tolist():
        keys, values, queries = row[0:2 * P:2], row[1:2 * P:2], row[2 * P::2]
        answers, scores = row[2 * P + 1::2], []
        for i, answer in enumerate(answers):
            counted = [v for k, v in zip(keys, values) if rule == "prompt" or k not in queries[:i]]
            counts = {v: counted.count(v) for v in set(counted)}
            modes = [v for v, c in counts.items() if c == max(counts.values())]
            scores.append((answer in modes) / len(modes))
        out.append(scores)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("rule", ["prompt", "unasked"])
@pytest.mark.parametrize("n_pairs, n_values, seed", [(1, 4, 0), (4, 3, 1), (6, 4, 2), (8, 64, 3), (5, 2, 4)])
def test_each_shortcut_equals_a_count_by_hand(rule, n_pairs, n_values, seed):
    batch = mqar(200, n_pairs, n_keys=16, n_values=n_values, seed=seed)
    assert torch.allclose(shortcut_accuracy(batch, rule), _brute_shortcut(batch, rule), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n, n_values", [(1, 5), (2, 3), (3, 4), (4, 3), (5, 2)])
def test_the_expected_mode_accuracy_equals_an_enumeration_of_every_draw(n, n_values):
    import itertools
    total = 0.0
    for draw in itertools.product(range(n_values), repeat=n):
        counts = [draw.count(v) for v in range(n_values)]
        modes = [v for v in range(n_values) if counts[v] == max(counts)]
        total += sum((a in modes) / len(modes) for a in draw) / n     # the answer: any of the n, equally
    assert abs(expected_mode_accuracy(n, n_values) - total / n_values ** n) < 1e-12


def test_the_staircase_and_its_distinct_value_limits():
    s = shortcut_baselines(8)
    assert s["chance"] < s["prompt"] < s["unasked"] < s["recall"] == 1.0
    assert s["unasked_by_slot"][-1] == 1.0 and s["unasked_by_slot"][0] == s["prompt"]
    assert abs(s["prompt"] - 0.1724) < 1e-4 and abs(s["unasked"] - 0.3651) < 1e-4
    # distinct values: 1/P and H_P / P
    wide = shortcut_baselines(8, n_values=10**9)
    assert abs(wide["prompt"] - 1 / 8) < 1e-6
    assert abs(wide["unasked"] - sum(1 / n for n in range(1, 9)) / 8) < 1e-6
    # a large batch lands near the expectation
    batch = mqar(20_000, 8, seed=5)
    assert abs(shortcut_accuracy(batch, "prompt").mean().item() - s["prompt"]) < 0.01
    by_slot = shortcut_accuracy(batch, "unasked").mean(0)
    assert (by_slot - torch.tensor(s["unasked_by_slot"], dtype=torch.float64)).abs().max() < 0.02


class Eliminator(torch.nn.Module):
    """Binds nothing: at each query, one-hot on the most frequent value among the pairs not yet asked."""

    def __init__(self, n_pairs: int, vocab: int):
        super().__init__()
        self.n_pairs, self.vocab = n_pairs, vocab

    def forward(self, tokens):
        P, b = self.n_pairs, tokens.shape[0]
        keys, values = tokens[:, 0:2 * P:2], tokens[:, 1:2 * P:2]
        guess = torch.zeros_like(tokens)
        for i in range(P):
            asked = (keys.unsqueeze(-1) == tokens[:, 2 * P:2 * P + 2 * i:2].unsqueeze(1)).any(-1)
            count = torch.zeros(b, self.vocab).scatter_add_(1, values, (~asked).float())
            guess[:, 2 * P + 2 * i] = count.argmax(-1)
        return torch.nn.functional.one_hot(guess, self.vocab).float()


def test_an_eliminator_climbs_by_slot_and_is_flat_by_pairs_back():
    P = 8
    batch = mqar(4000, P, seed=6)
    model = Eliminator(P, batch.vocab)
    by_slot = accuracy_by_slot(model, batch)
    expected = torch.tensor(shortcut_baselines(P)["unasked_by_slot"], dtype=torch.float64)
    assert (by_slot - expected).abs().max() < 0.03 and by_slot[-1] == 1.0
    back = torch.tensor(recall_profile(model, as_zoology_batch(batch))["pairs_back"]["accuracy"])
    assert back.max() - back.min() < 0.05                     # the recency profile cannot see it
    assert torch.equal(accuracy_by_slot(model(batch.inputs).argmax(-1), batch), by_slot)


def test_accuracy_by_slot_of_an_oracle_is_one_and_bad_batches_are_refused():
    batch = mqar(50, 4, seed=7)
    assert accuracy_by_slot(Oracle(4, 4, batch.vocab), batch).tolist() == [1.0] * 4
    with pytest.raises(TypeError, match="batch must be an MQARBatch"):
        accuracy_by_slot(Oracle(4, 4, 128), mqar_zoology(4, 4, 32, vocab=64))
    with pytest.raises(ValueError, match="model must give"):
        accuracy_by_slot(torch.zeros(50, 3, dtype=torch.long), batch)
    with pytest.raises(ValueError, match="rule must be"):
        shortcut_accuracy(batch, "mode")


def test_recall_profile_names_the_conversion_for_a_simplified_batch():
    with pytest.raises(TypeError, match="as_zoology_batch"):
        recall_profile(Oracle(4, 4, 128), mqar(8, 4, seed=0))
