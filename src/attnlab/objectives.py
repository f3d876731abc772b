"""Pre-training objectives beside next-token prediction: BERT's masked LM and T5's span corruption.

Read alongside: Devlin et al. 2019, "BERT", section 3.1 and appendix C.2 (15% of positions,
80% [MASK] / 10% random / 10% unchanged); Raffel et al. 2020, "Exploring the Limits of Transfer
Learning with a Unified Text-to-Text Transformer" (T5), section 3.1.4 and figure 2 (span
corruption with sentinels; 15% noise density, mean span length 3).

Shapes: ids (b, L) token ids; spans are (start, length) pairs over a list of L tokens.
"""
from __future__ import annotations

import torch


def mlm_corrupt(ids: torch.Tensor, *, vocab_size: int, mask_id: int, p: float = 0.15,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    r"""BERT's masked-LM corruption: (inputs, targets), both shaped like ``ids``.

    Each position is selected with probability p. A selected position becomes ``mask_id`` with
    probability 0.8, a uniformly random token with probability 0.1, and stays unchanged with
    probability 0.1; its target is the original id. Unselected positions have target -100
    (ignored by the loss):

    .. math:: \mathcal L_{\text{MLM}} = -\sum_{i \in \text{selected}} \log p(x_i \mid \tilde x)

    The 10% random and 10% unchanged keep the model from learning that only [MASK] positions
    matter, since [MASK] never appears at fine-tuning time.
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"p must lie in (0, 1], got {p}")
    selected = torch.rand(ids.shape, generator=generator) < p
    action = torch.rand(ids.shape, generator=generator)
    random_ids = torch.randint(0, vocab_size, ids.shape, generator=generator)
    inputs = torch.where(selected & (action < 0.8), torch.full_like(ids, mask_id), ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    targets = torch.where(selected, ids, torch.full_like(ids, -100))
    return inputs, targets


def span_corrupt(tokens: list[str], spans: list[tuple[int, int]],
                 sentinels: list[str] | None = None) -> tuple[list[str], list[str]]:
    """T5's span corruption: drop each span from the input, put it in the target after its sentinel.

    spans: sorted, non-overlapping (start, length) pairs. The input replaces span k by sentinel k;
    the target is sentinel k followed by span k's tokens, for every k, then one final sentinel.
    Default sentinels are T5's ``<extra_id_0>, <extra_id_1>, ...``; its figure 2 writes <X>, <Y>, <Z>.
    """
    sentinels = [f"<extra_id_{i}>" for i in range(len(spans) + 1)] if sentinels is None else list(sentinels)
    if len(sentinels) < len(spans) + 1:
        raise ValueError(f"need len(spans) + 1 = {len(spans) + 1} sentinels, got {len(sentinels)}")
    inputs, targets, position = [], [], 0
    for k, (start, length) in enumerate(spans):
        if start < position or length < 1 or start + length > len(tokens):
            raise ValueError(f"spans must be sorted, non-overlapping, non-empty and inside the {len(tokens)} tokens; "
                             f"span {k} is ({start}, {length})")
        inputs += tokens[position:start] + [sentinels[k]]
        targets += [sentinels[k]] + tokens[start:start + length]
        position = start + length
    inputs += tokens[position:]
    targets.append(sentinels[len(spans)])
    return inputs, targets


def random_spans(n: int, *, noise_density: float = 0.15, mean_span_length: float = 3.0,
                 generator: torch.Generator | None = None) -> list[tuple[int, int]]:
    """Random spans as T5 draws them: round(n · density) noise tokens in round(noise / mean) spans.

    The noise tokens and the kept tokens are each split into that many non-empty runs at random,
    and the runs alternate, kept run first, so the spans never touch.
    """
    n_noise = min(max(round(n * noise_density), 1), n - 1)
    n_spans = max(round(n_noise / mean_span_length), 1)

    def split(total: int) -> list[int]:
        cuts = sorted((torch.randperm(total - 1, generator=generator)[:n_spans - 1] + 1).tolist())
        edges = [0] + cuts + [total]
        return [b - a for a, b in zip(edges, edges[1:])]

    if n < 2 or n - n_noise < n_spans:
        raise ValueError(f"n = {n} is too short for {n_spans} spans")
    kept, noise = split(n - n_noise), split(n_noise)
    spans, position = [], 0
    for keep, length in zip(kept, noise):
        position += keep
        spans.append((position, length))
        position += length
    return spans
