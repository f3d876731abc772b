"""Small helpers of the recall lab (chapter 13).

:func:`shortcut_accuracy` and :func:`shortcut_baselines` give, exactly, what two guessers that
bind no key to its value score on the simplified prompts; :func:`accuracy_by_slot` scores a model
by query slot, where the second of them shows. :func:`as_zoology_batch` lets the per-recency evaluation of the grid
(:func:`attnlab.experiments.mqar.recall_profile`, written for Zoology's prompts) score the
simplified prompts of :func:`attnlab.tasks.mqar` too; :func:`window_ceiling` is the exact
accuracy ceiling a stack of causal windows has on those prompts.
"""
from __future__ import annotations

import torch

from . import _checks
from .tasks import MQARBatch, ZoologyMQARBatch


def as_zoology_batch(batch: MQARBatch) -> ZoologyMQARBatch:
    r"""The simplified MQAR prompts of :func:`attnlab.tasks.mqar` as a :class:`ZoologyMQARBatch`.

    A simplified prompt asks every key once: query slot :math:`i` (position :math:`2P + 2i`)
    asks pair :math:`\pi(i)`. Zoology's batch records, per pair :math:`j`, the gap whose slot asks
    it, :math:`g_j = 1 + \pi^{-1}(j)`; with it ``query_positions()`` is
    :math:`2P + 2(g_j - 1)` and ``pairs_back()`` is :math:`P - j`, as for Zoology's prompts, so
    :func:`attnlab.experiments.mqar.recall_profile` scores the batch by recency. ``inputs`` and
    ``targets`` are shared with ``batch``, not copied. A :class:`ZoologyMQARBatch` is returned
    as it is.

    Needs every key asked once (``n_queries == n_pairs``); the prompts are (b, 4P).
    """
    if isinstance(batch, ZoologyMQARBatch):
        return batch
    if not isinstance(batch, MQARBatch):
        raise TypeError(f"as_zoology_batch: batch must be an MQARBatch from attnlab.tasks.mqar, "
                        f"got {type(batch).__name__}")
    inputs, asked = batch.inputs, batch.query_mask
    if inputs.dim() != 2 or not asked.any():
        raise ValueError(f"as_zoology_batch: batch.inputs must be (b, L) prompts with queries, "
                         f"got {tuple(inputs.shape)}")
    n_pairs = int(asked[0].nonzero()[0]) // 2
    expected = torch.zeros(inputs.shape[1], dtype=torch.bool)
    expected[2 * n_pairs::2] = True
    if inputs.shape[1] != 4 * n_pairs or not torch.equal(asked, expected.expand_as(asked)):
        raise ValueError(f"as_zoology_batch: every key must be asked once (n_queries = n_pairs = {n_pairs}, "
                         f"L = {4 * n_pairs}); batch asks {int(asked[0].sum())} queries in "
                         f"{inputs.shape[1]} tokens")
    keys, query_keys = inputs[:, 0:2 * n_pairs:2], inputs[:, 2 * n_pairs::2]
    match = query_keys.unsqueeze(-1) == keys.unsqueeze(1)                  # (b, slot, pair)
    if not match.sum(1).eq(1).all():
        raise ValueError("as_zoology_batch: a key of the context is asked twice or never")
    gaps = 1 + match.long().argmax(1)                                      # (b, pair): 1 + its slot
    return ZoologyMQARBatch(inputs, batch.targets, batch.vocab, n_pairs, gaps)


def window_ceiling(n_pairs: int, window: int, *, n_layers: int = 2, n_values: int = 64) -> float:
    r"""The highest accuracy a stack of ``n_layers`` causal windows can reach on :func:`attnlab.tasks.mqar`.

    A window of :math:`w` lets position :math:`t` read :math:`t - w \dots t`, so :math:`n` layers
    reach :math:`nw` tokens back. Query slot :math:`i` (position :math:`2P + 2i`) asks pair
    :math:`j` (value at :math:`2j + 1`) with probability :math:`1/P` for every :math:`j`, at
    distance :math:`2(P + i - j) - 1`. A query whose value lies within reach can be answered; any
    other, whose value (drawn uniformly with replacement) nothing in reach depends on, only
    guessed, right with probability :math:`1/V`. With :math:`s` the share within reach:

    .. math:: \text{ceiling} = s + (1 - s) / V.
    """
    _checks.ints("window_ceiling", n_pairs=n_pairs, window=window, n_layers=n_layers, n_values=n_values)
    slot, pair = torch.meshgrid(torch.arange(n_pairs), torch.arange(n_pairs), indexing="ij")
    distance = 2 * (n_pairs + slot - pair) - 1
    share = (distance <= n_layers * window).double().mean().item()
    return share + (1 - share) / n_values


def _simple_parts(fn: str, batch: MQARBatch):
    """Pairs and queries of a simplified batch: keys, values (b, P), query keys, answers (b, Q)."""
    if isinstance(batch, ZoologyMQARBatch) or not isinstance(batch, MQARBatch):
        raise TypeError(f"{fn}: batch must be an MQARBatch from attnlab.tasks.mqar (the simplified "
                        f"prompts k v … q a …), got {type(batch).__name__}")
    inputs, asked = batch.inputs, batch.query_mask
    if inputs.dim() != 2 or not asked.any():
        raise ValueError(f"{fn}: batch.inputs must be (b, L) prompts with queries, got {tuple(inputs.shape)}")
    n_pairs = int(asked[0].nonzero()[0]) // 2
    keys, values = inputs[:, 0:2 * n_pairs:2], inputs[:, 1:2 * n_pairs:2]
    return keys, values, inputs[:, 2 * n_pairs::2], inputs[:, 2 * n_pairs + 1::2]


def shortcut_accuracy(batch: MQARBatch, rule: str = "unasked") -> torch.Tensor:
    r"""Exact expected correctness, per query, of a guesser that binds no key to its value.

    On the simplified prompts of :func:`attnlab.tasks.mqar` (values drawn with replacement, every
    answer echoed after its query) two guessers need no binding:

    - ``rule="prompt"``: the most frequent value among the :math:`P` pairs' values;
    - ``rule="unasked"``: the most frequent value among the pairs whose key has not been asked
      before this query (query slot :math:`i` leaves :math:`P - i` of them; the echoed answers
      show which values the asked pairs took).

    Ties are broken uniformly at random, so the expected correctness of query :math:`i` with
    answer :math:`a_i` and counted values :math:`c_i(v)` is, computed per prompt,

    .. math:: r_i = \frac{\mathbb 1\big[c_i(a_i) = \max_v c_i(v)\big]}
                         {\big|\{v : c_i(v) = \max_u c_i(u)\}\big|}.

    Returns (b, Q) float64; ``.mean(0)`` is the accuracy by query slot, ``.mean()`` the
    accuracy. On Zoology's prompts (values distinct, answers not echoed) neither rule applies:
    without binding, every value of the prompt is equally likely, :math:`1/P`.
    """
    keys, values, query_keys, answers = _simple_parts("shortcut_accuracy", batch)
    if rule not in ("prompt", "unasked"):
        raise ValueError(f"shortcut_accuracy: rule must be 'prompt' or 'unasked', got {rule!r}")
    b, n_queries = query_keys.shape
    same = values.unsqueeze(-1) == values.unsqueeze(1)                       # (b, P, P)
    out = torch.empty(b, n_queries, dtype=torch.float64)
    for i in range(n_queries):
        asked = (keys.unsqueeze(-1) == query_keys[:, :i].unsqueeze(1)).any(-1)   # (b, P)
        counted = ~asked if rule == "unasked" else torch.ones_like(asked)
        count = (same & counted.unsqueeze(1)).sum(-1)                        # of pair j's value
        count = torch.where(counted, count, 0)                               # only counted pairs compete
        top = count.max(-1, keepdim=True).values
        is_mode = counted & (count == top)                                   # pairs holding a mode
        # each mode value once: a pair is the first of its value among the mode pairs
        first = is_mode & ~(same & is_mode.unsqueeze(1)).tril(-1).any(-1)
        n_modes = first.sum(-1)
        hit = (is_mode & (values == answers[:, i:i + 1])).any(-1)
        out[:, i] = hit.double() / n_modes.double()
    return out


def expected_mode_accuracy(n: int, n_values: int = 64) -> float:
    r"""Expected accuracy of guessing the most frequent of :math:`n` values drawn uniformly with
    replacement from :math:`V` = ``n_values``, when the answer is one of the :math:`n` (ties broken
    uniformly).

    Summed over the :math:`n` possible answers, the hits are (number of modes) × (their count
    :math:`M`), and a guess among the modes is right with probability 1/(number of modes), so the
    accuracy is :math:`\mathbb E[M_n] / n`. :math:`\mathbb E[M_n]` is computed exactly by
    enumerating the count patterns (integer partitions of :math:`n`) with their multinomial
    probabilities. With distinct values :math:`M_n = 1` and the accuracy is :math:`1/n`.
    """
    _checks.ints("expected_mode_accuracy", n=n, n_values=n_values)
    from fractions import Fraction
    from math import factorial, perm

    def partitions(total, largest):
        if total == 0:
            yield ()
            return
        for part in range(min(total, largest), 0, -1):
            for rest in partitions(total - part, part):
                yield (part,) + rest

    expected = Fraction(0)
    for counts in partitions(n, n):
        if len(counts) > n_values:
            continue
        ways = perm(n_values, len(counts))                      # which values take the counts …
        for c in set(counts):
            ways //= factorial(counts.count(c))                  # … up to equal counts
        sequences = factorial(n)
        for c in counts:
            sequences //= factorial(c)
        expected += Fraction(ways * sequences, n_values ** n) * counts[0]
    return float(expected / n)


def shortcut_baselines(n_pairs: int, n_values: int = 64) -> dict:
    r"""The staircase of the simplified MQAR, exactly, over the task's distribution.

    ``chance`` :math:`1/V`; ``prompt`` the most frequent value of the prompt,
    :math:`\mathbb E[M_P]/P`; ``unasked`` the most frequent value among the pairs not yet asked,
    by query slot :math:`i = 0 \dots P-1` equal to :math:`\mathbb E[M_{P-i}]/(P-i)` (the answer is
    one of the :math:`P - i` unasked pairs, whose values are still independent and uniform) and
    on average their mean; ``recall`` 1. With distinct values (``n_values`` → ∞) ``prompt`` is
    :math:`1/P` and ``unasked`` :math:`H_P / P`. See :func:`shortcut_accuracy` for a batch.
    """
    _checks.ints("shortcut_baselines", n_pairs=n_pairs, n_values=n_values)
    by_slot = [expected_mode_accuracy(n_pairs - i, n_values) for i in range(n_pairs)]
    return {"chance": 1 / n_values, "prompt": by_slot[0], "unasked": sum(by_slot) / n_pairs,
            "unasked_by_slot": by_slot, "recall": 1.0}


def accuracy_by_slot(model, batch: MQARBatch) -> torch.Tensor:
    r"""Accuracy at each query slot :math:`i` (the :math:`i`-th query, position :math:`2P + 2i`).

    .. math:: \text{acc}_i = \Pr\big[\hat y_{2P+2i} = a_i\big]

    ``model`` maps (b, L) tokens to (b, L, vocab) logits (a module or any callable), or is a
    (b, L) long tensor of predicted tokens or (b, L, vocab) logits already computed. Returns
    (Q,) float64. A model that recalls is flat at 1; the ``unasked`` shortcut of
    :func:`shortcut_accuracy` rises to 1 at the last slot.
    """
    _, _, query_keys, _ = _simple_parts("accuracy_by_slot", batch)
    if isinstance(model, torch.Tensor):
        guess = model
    elif callable(model):
        with torch.no_grad():
            guess = model(batch.inputs)
    else:
        raise TypeError(f"accuracy_by_slot: model must be a callable or a tensor of predictions, "
                        f"got {type(model).__name__}")
    if guess.dim() == 3 and guess.is_floating_point():
        guess = guess.argmax(-1)
    if guess.shape != batch.inputs.shape:
        raise ValueError(f"accuracy_by_slot: model must give (b, L) tokens or (b, L, vocab) logits "
                         f"for inputs {tuple(batch.inputs.shape)}, got {tuple(guess.shape)}")
    asked = batch.query_mask
    n_queries = query_keys.shape[1]
    right = guess[asked].view(-1, n_queries) == batch.targets[asked].view(-1, n_queries)
    return right.double().mean(0)
