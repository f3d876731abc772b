"""Small helpers of the recall lab (chapter 13).

:func:`as_zoology_batch` lets the per-recency evaluation of the grid
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
