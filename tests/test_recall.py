"""The recall lab's helpers: the simplified MQAR as a Zoology batch, and a window's recall ceiling."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from attnlab.experiments.mqar import recall_profile
from attnlab.recall import as_zoology_batch, window_ceiling
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
