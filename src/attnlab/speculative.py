"""Speculative decoding: a small draft model proposes, the target model verifies, nothing changes.

Read alongside: Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via
Speculative Decoding" (section 2: the rejection rule; section 3: the expected tokens per step
and the expected wall-time improvement); Chen et al. 2023, "Accelerating Large Language
Model Decoding with Speculative Sampling" (the same rule, independently).

One step: the draft samples γ tokens x_1..x_γ from its distributions q_1..q_γ; the target
scores the prefix and all γ drafts in *one* forward pass, giving p_1..p_{γ+1}. Draft x_i is
accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection a token is drawn
from the residual max(0, p_i - q_i) (normalised) and the step ends; if all γ are accepted, a
bonus token comes from p_{γ+1}. Every emitted token is distributed exactly as the target's own
sample: :func:`output_distribution` computes that distribution exactly, by enumeration.

Shapes: a distribution is a (V,) tensor of probabilities over a vocabulary of V tokens;
p (γ + 1, V) and q (γ, V) stack one per drafted position; a prefix is a tuple of token ids.
A model is any callable from token ids (1, L) to logits (1, L, V) (or a tuple whose first
element is those logits).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from . import _checks

ProbsFn = Callable[[tuple], torch.Tensor]


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    r"""Expected tokens one step emits when each draft is accepted with probability α.

    .. math:: \mathbb E[\text{tokens}] = \sum_{i=0}^{\gamma} \alpha^i = \frac{1 - \alpha^{\gamma + 1}}{1 - \alpha}
              \quad (\gamma + 1 \text{ when } \alpha = 1)

    It lies between 1 (every draft rejected: the target's correction is still one token) and γ + 1.
    """
    if not 0 <= alpha <= 1 or gamma < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and gamma >= 0, got alpha={alpha}, gamma={gamma}")
    return float(gamma + 1) if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def expected_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    r"""Expected wall-time speed-up over plain decoding, with c = (draft step time) / (target step time).

    .. math:: S = \frac{1 - \alpha^{\gamma + 1}}{(1 - \alpha)(\gamma c + 1)}

    One step costs γ draft steps and one target pass (γc + 1 target-step units) and emits
    :func:`expected_tokens_per_step` tokens. It exceeds 1 when drafts are cheap and often right.
    """
    if cost_ratio < 0:
        raise ValueError(f"cost_ratio must be >= 0, got {cost_ratio}")
    return expected_tokens_per_step(alpha, gamma) / (gamma * cost_ratio + 1)


def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    r"""Probability that a draft sampled from q is accepted under p: :math:`\beta = \sum_x \min(p(x), q(x))`.

    It equals 1 - TV(p, q). p, q: (..., V) -> (...).
    """
    if p.shape != q.shape:
        raise ValueError(f"acceptance_rate: p and q must have the same shape (..., V), "
                         f"got {tuple(p.shape)} and {tuple(q.shape)}")
    return torch.minimum(p, q).sum(-1)


def accept_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    r"""Probability of keeping a drafted token x: :math:`\min(1, p(x) / q(x))` (q(x) > 0 since x was drawn from q)."""
    if not (q_x > 0).all():
        raise ValueError(f"accept_probability: q_x must be positive (x was drawn from q, so q(x) > 0), "
                         f"got {q_x.min().item()}")
    return torch.clamp(p_x / q_x, max=1.0)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    r"""What to sample after a rejection: :math:`p'(x) = \frac{\max(0, p(x) - q(x))}{\sum_y \max(0, p(y) - q(y))}`.

    When p = q nothing is ever rejected; p itself is returned so the result is always a distribution.
    p, q: (V,) -> (V,).
    """
    if p.dim() != 1 or q.shape != p.shape:
        raise ValueError(f"residual_distribution: p and q must both be (V,), got {tuple(p.shape)} and {tuple(q.shape)}")
    excess = torch.clamp(p - q, min=0.0)
    total = excess.sum()
    return excess / total if total > 0 else p


def verify(p: torch.Tensor, q: torch.Tensor, drafts: list[int],
           generator: torch.Generator | None = None) -> list[int]:
    """The rejection step: the tokens one speculative step emits.

    The accepted drafts, then one more token (residual sample or bonus).

    Args: p (γ + 1, V) target distributions at the γ drafted positions and the one
        after; q (γ, V) the draft's distributions; drafts: the γ drafted token ids.
    Returns: between 1 and γ + 1 token ids.
    """
    if p.shape[0] != len(drafts) + 1 or q.shape[0] != len(drafts):
        raise ValueError(f"with {len(drafts)} drafts, p must be ({len(drafts) + 1}, V) "
                         f"and q ({len(drafts)}, V); "
                         f"got p {tuple(p.shape)}, q {tuple(q.shape)}")
    emitted = []
    for i, x in enumerate(drafts):
        u = torch.rand((), generator=generator, dtype=p.dtype)
        if u < accept_probability(p[i, x], q[i, x]):
            emitted.append(x)
        else:
            residual = residual_distribution(p[i], q[i])
            emitted.append(int(torch.multinomial(residual, 1, generator=generator)))
            return emitted
    emitted.append(int(torch.multinomial(p[-1], 1, generator=generator)))
    return emitted


def step_distribution(target: ProbsFn, draft: ProbsFn, prefix: tuple, gamma: int) -> dict[tuple, float]:
    r"""Exact distribution of what one speculative step emits from ``prefix``: {tokens: probability}.

    Enumerates every draft token at every position with the probabilities :func:`verify` uses:
    draft x is drawn with q(x) and kept with :func:`accept_probability`; a rejection (probability
    :math:`1 - \sum_x q(x)\min(1, p(x)/q(x))`) emits y with :func:`residual_distribution`.
    ``target`` and ``draft`` map a prefix to its next-token distribution (V,).
    """
    _checks.ints("step_distribution", gamma=gamma, minimum=0)
    result: dict[tuple, float] = {}

    def walk(emitted: tuple, prob: float, depth: int):
        context = prefix + emitted
        p = target(context)
        if depth == gamma:                                             # every draft accepted: bonus token
            for y in range(p.shape[0]):
                result[emitted + (y,)] = result.get(emitted + (y,), 0.0) + prob * float(p[y])
            return
        q = draft(context)
        kept = torch.where(q > 0, q * accept_probability(p, q.clamp_min(1e-300)), torch.zeros_like(q))
        for x in torch.nonzero(kept).flatten().tolist():
            walk(emitted + (x,), prob * float(kept[x]), depth + 1)
        rejected = 1.0 - float(kept.sum())
        if rejected > 0:
            residual = residual_distribution(p, q)
            for y in torch.nonzero(residual).flatten().tolist():
                result[emitted + (y,)] = result.get(emitted + (y,), 0.0) + prob * rejected * float(residual[y])

    walk((), 1.0, 0)
    return result


def output_distribution(target: ProbsFn, draft: ProbsFn, prefix: tuple, gamma: int, length: int,
                        vocab: int) -> torch.Tensor:
    """Exact probability of each continuation of ``length`` tokens under repeated speculative steps.

    Steps are chained until at least ``length`` tokens are out; longer outputs are cut to
    ``length``. Returns a float64 tensor of shape (V,) * length.
    """
    _checks.ints("output_distribution", length=length, vocab=vocab)
    _checks.ints("output_distribution", gamma=gamma, minimum=0)
    table = torch.zeros((vocab,) * length, dtype=torch.float64)

    def run(emitted: tuple, prob: float):
        if len(emitted) >= length:
            table[emitted[:length]] += prob
            return
        for tokens, p in step_distribution(target, draft, prefix + emitted, gamma).items():
            run(emitted + tokens, prob * p)

    run((), 1.0)
    return table


def autoregressive_distribution(target: ProbsFn, prefix: tuple, length: int, vocab: int) -> torch.Tensor:
    r"""Exact probability of each continuation when sampling the target token by token:
    :math:`\prod_t p(x_t \mid \text{prefix}, x_{<t})`. Returns (V,) * length, float64."""
    _checks.ints("autoregressive_distribution", length=length, vocab=vocab)
    table = torch.zeros((vocab,) * length, dtype=torch.float64)
    for tokens in itertools.product(range(vocab), repeat=length):
        prob = 1.0
        for t in range(length):
            prob *= float(target(prefix + tokens[:t])[tokens[t]])
        table[tokens] = prob
    return table


def _logits(model, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    out = model(ids, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def next_token_probs(model, *, temperature: float = 1.0) -> ProbsFn:
    """Wrap a model as prefix (tuple of ids) -> next-token distribution (V,), float64, memoised."""
    if not temperature > 0:
        raise ValueError(f"next_token_probs: temperature must be positive, got {temperature}")
    cache: dict[tuple, torch.Tensor] = {}
    device = next(model.parameters()).device if isinstance(model, torch.nn.Module) else None

    @torch.no_grad()
    def probs(prefix: tuple) -> torch.Tensor:
        if prefix not in cache:
            logits = _logits(model, torch.tensor([prefix], dtype=torch.long, device=device))[0, -1]
            cache[prefix] = torch.softmax(logits.double().cpu() / temperature, dim=-1)
        return cache[prefix]

    return probs


@torch.no_grad()
def speculative_generate(target, draft, prompt: torch.Tensor, max_new_tokens: int, *, gamma: int = 4,
                         temperature: float = 1.0, use_cache: bool = False,
                         generator: torch.Generator | None = None):
    """Sample ``max_new_tokens`` tokens from ``target`` with speculative decoding (batch 1).

    Args: target, draft: models (ids (1, L) -> logits (1, L, V)); prompt (1, L0) ids; gamma >= 1
        drafts per step (fewer in the last step, so no model sees more than L0 + max_new_tokens
        positions); use_cache: keep a KV cache per model (both must have ``new_cache``, as
        :class:`~attnlab.models.MicroGPT` does): each call then feeds only the tokens its cache
        lacks, and after verification both caches are rolled back (``truncate``) to the tokens
        kept, minus the newest, which the next call feeds; generator on the CPU drives all
        random choices.
    Returns: (ids (1, L0 + max_new_tokens), stats) with stats = {"steps": target passes,
        "drafted": drafts proposed, "accepted": drafts kept, "rejected": drafts rejected,
        "acceptance": accepted / (accepted + rejected)}. Drafts after the first rejection of a
        step are never examined, so they count in neither: dividing by "drafted" would bias
        the acceptance rate low.
    """
    if prompt.dim() != 2 or prompt.shape[0] != 1:
        raise ValueError(f"prompt must have shape (1, L0), got {tuple(prompt.shape)}")
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    if use_cache and not all(hasattr(m, "new_cache") for m in (target, draft)):
        raise ValueError("use_cache=True needs target and draft with a new_cache method (e.g. MicroGPT); "
                         f"got {type(target).__name__} and {type(draft).__name__}")
    total = prompt.shape[1] + max_new_tokens
    caches = (target.new_cache(1, total), draft.new_cache(1, total)) if use_cache else (None, None)

    def run(model, cache, ids):                              # logits for the tokens the cache lacks
        if cache is None:
            return _logits(model, ids)
        return _logits(model, ids[:, cache.length:], cache=cache)

    ids = prompt
    steps = drafted = accepted = rejected = 0
    while (remaining := total - ids.shape[1]) > 0:
        n_drafts = min(gamma, remaining - 1)                 # never run past prompt + max_new_tokens positions
        context = ids
        drafts, q_rows = [], []
        for _ in range(n_drafts):
            q = torch.softmax(run(draft, caches[1], context)[0, -1].double().cpu() / temperature, dim=-1)
            x = int(torch.multinomial(q, 1, generator=generator))
            drafts.append(x)
            q_rows.append(q)
            context = torch.cat([context, context.new_tensor([[x]])], dim=1)
        logits = run(target, caches[0], context)[0, -n_drafts - 1:]                      # one target pass
        p = torch.softmax(logits.double().cpu() / temperature, dim=-1)
        q_stack = torch.stack(q_rows) if q_rows else p.new_zeros(0, p.shape[-1])
        emitted = verify(p, q_stack, drafts, generator)
        accepted += len(emitted) - 1                                    # the last token is a correction or the bonus
        rejected += len(emitted) <= n_drafts                            # the step ended at a rejected draft
        drafted += n_drafts
        steps += 1
        kept = ids.shape[1] + len(emitted) - 1                          # positions whose K, V stay valid
        for cache in caches:
            if cache is not None and cache.length > kept:
                cache.truncate(kept)                                    # forget the rejected drafts
        ids = torch.cat([ids, ids.new_tensor([emitted])], dim=1)
    stats = {"steps": steps, "drafted": drafted, "accepted": accepted, "rejected": rejected,
             "acceptance": accepted / max(accepted + rejected, 1)}
    return ids, stats
