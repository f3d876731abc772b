"""Transfer questions of chapter 13: each answer computed with attnlab (see test_quiz_answers.py,
which holds the chapter's first four)."""

import torch

from quiz_checks import accepts


def test_13_zoology_query_position():
    from attnlab.tasks import mqar_zoology
    batch = mqar_zoology(64, n_pairs=16, seq_len=128, vocab=256, seed=0)
    rows, pairs = (batch.gaps == 5).nonzero(as_tuple=True)        # the pairs asked at gap 5
    at = batch.query_positions()[rows, pairs]
    assert len(at) > 0 and at.unique().numel() == 1
    assert torch.equal(batch.inputs[rows, at], batch.inputs[rows, 2 * pairs])   # its key, asked
    assert torch.equal(batch.targets[rows, at], batch.inputs[rows, 2 * pairs + 1])
    accepts("13-zoology-query-position", int(at[0]))


def test_13_mamba_state_d48():
    from attnlab.experiments.mqar import PointConfig, build_model
    accepts("13-mamba-state-d48", build_model(PointConfig("mamba", 48)).state_size(32))


def test_13_hybrid_state_l128():
    from attnlab.experiments.mqar import PointConfig, build_model
    accepts("13-hybrid-state-l128", build_model(PointConfig("hybrid", 64)).state_size(128))


def test_13_oracle_last_k():
    from attnlab.experiments.mqar import recall_profile
    from attnlab.recall import as_zoology_batch
    from attnlab.tasks import mqar
    P, k, values = 16, 5, 64
    prompts = mqar(400, P, n_keys=64, n_values=values, seed=1)

    class LastPairs(torch.nn.Module):                  # right for the last k pairs, token 0 otherwise
        def forward(self, x):
            keys, vals = x[:, 0:2 * P:2][:, -k:], x[:, 1:2 * P:2][:, -k:]
            hit = x.unsqueeze(-1) == keys.unsqueeze(1)
            guess = (hit * vals.unsqueeze(1)).sum(-1)
            guess[:, :2 * P] = 0
            return torch.nn.functional.one_hot(guess, prompts.vocab).float()

    profile = recall_profile(LastPairs(), as_zoology_batch(prompts))
    assert profile["pairs_back"]["accuracy"] == [1.0] * k + [0.0] * (P - k)
    recalled = profile["accuracy"]                      # k / P exactly
    accepts("13-oracle-last-k", recalled + (1 - recalled) / values)


def test_13_window_ceiling_w6():
    from attnlab.recall import window_ceiling
    ceiling = window_ceiling(8, 6, n_layers=2, n_values=64)
    assert window_ceiling(8, 8) > ceiling > window_ceiling(8, 6, n_layers=1)
    accepts("13-window-ceiling-w6", ceiling)


def test_13_shortcut_elimination_distinct():
    from attnlab.recall import expected_mode_accuracy, shortcut_baselines
    P = 6
    distinct = shortcut_baselines(P, n_values=10**12)              # values effectively never repeat
    assert abs(distinct["prompt"] - 1 / P) < 1e-9
    assert all(abs(expected_mode_accuracy(n, 10**12) - 1 / n) < 1e-9 for n in range(1, P + 1))
    accepts("13-shortcut-elimination-distinct", distinct["unasked"])


def test_13_window_reach_zoology_l32():
    from attnlab.tasks import mqar_zoology
    P, L = 8, 32
    batch = mqar_zoology(4096, n_pairs=P, seq_len=L, vocab=256, seed=4)
    distance = batch.query_positions() - 2 * torch.arange(P) - 1          # value to query
    assert batch.query_positions().max() == L - 2 and distance.min() >= 1
    accepts("13-window-reach-zoology-l32", int(distance.max()))
