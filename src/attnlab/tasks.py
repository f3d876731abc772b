"""Synthetic tasks, generated on the fly from a seed (nothing is downloaded).

Shapes: b prompts, N context examples, d input dimension.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from . import _checks


@dataclass
class RegressionPrompts:
    """In-context linear regression: y_i = w · x_i + noise, a fresh w per prompt."""

    x: torch.Tensor       # (b, N, d) context inputs
    y: torch.Tensor       # (b, N) context targets
    x_test: torch.Tensor  # (b, d) query input
    y_test: torch.Tensor  # (b,) its target
    w: torch.Tensor       # (b, d) the hidden weights


def in_context_regression(batch: int, n_context: int, d: int, *, noise: float = 0.0, seed: int = 0,
                          dtype: torch.dtype = torch.float64) -> RegressionPrompts:
    """Prompts of N (x, y) pairs from a random linear map w ~ N(0, I), x ~ N(0, I), plus a query."""
    _checks.ints("in_context_regression", batch=batch, n_context=n_context, d=d)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(batch, d, generator=g, dtype=dtype)
    x = torch.randn(batch, n_context + 1, d, generator=g, dtype=dtype)
    y = torch.einsum("bnd,bd->bn", x, w) + noise * torch.randn(batch, n_context + 1, generator=g, dtype=dtype)
    return RegressionPrompts(x[:, :-1], y[:, :-1], x[:, -1], y[:, -1], w)


@dataclass
class ModularAddition:
    """Every pair (a, b) of Z_p with its label (a + b) mod p, split into train and validation."""

    p: int
    train_inputs: torch.Tensor   # (n_train, 2) long: the pairs (a, b)
    train_targets: torch.Tensor  # (n_train,) long: (a + b) mod p
    val_inputs: torch.Tensor     # (p^2 - n_train, 2)
    val_targets: torch.Tensor    # (p^2 - n_train,)


def modular_addition(p: int = 97, train_fraction: float = 0.5, *, seed: int = 0) -> ModularAddition:
    r"""The full table of :math:`c = (a + b) \bmod p` for :math:`a, b \in \{0, \dots, p-1\}`, split at random.

    The p^2 pairs are shuffled with ``seed``; the first ``round(train_fraction * p^2)`` are the
    training set (Power et al. 2022, "Grokking"), the rest the validation set.
    """
    if p < 2:
        raise ValueError(f"p must be at least 2, got {p}")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must lie strictly between 0 and 1, got {train_fraction}")
    a, b = torch.meshgrid(torch.arange(p), torch.arange(p), indexing="ij")
    pairs = torch.stack([a.reshape(-1), b.reshape(-1)], dim=-1)
    labels = (pairs[:, 0] + pairs[:, 1]) % p
    order = torch.randperm(p * p, generator=torch.Generator().manual_seed(seed))
    n_train = round(train_fraction * p * p)
    train, val = order[:n_train], order[n_train:]
    return ModularAddition(p, pairs[train], labels[train], pairs[val], labels[val])


SNAPSHOT_FILE = "microgpt_pydoc_topics.txt.gz"
SNAPSHOT_PYTHON = "3.11.7"


def python_docs_text(*, source: str = "snapshot") -> str:
    """English prose about Python: the help topics of ``pydoc`` (about 465 thousand characters).

    ``pydoc_data.topics`` holds the reference-manual pages that ``help("assert")`` prints, joined
    here in sorted order. They change between Python versions, so by default (``source="snapshot"``)
    the text is the copy shipped in ``attnlab/data/microgpt_pydoc_topics.txt.gz``, taken from
    CPython 3.11.7: every reader gets the same characters and the same ids, and shipped weights
    stay valid. ``source="installed"`` reads this Python's own ``pydoc_data`` instead (ImportError,
    never a toy fallback, where a distribution has stripped it). Nothing is downloaded.
    """
    if source == "snapshot":
        import gzip
        from importlib import resources

        return gzip.decompress(resources.files("attnlab").joinpath("data", SNAPSHOT_FILE).read_bytes()).decode("utf-8")
    if source != "installed":
        raise ValueError(f"source must be 'snapshot' or 'installed', got {source!r}")
    try:
        from pydoc_data.topics import topics
    except ImportError as err:
        raise ImportError("this Python has no pydoc_data module; pass char_corpus(path=...) a text file") from err
    return "\n\n".join(topics[key] for key in sorted(topics))


# A line made only of markup characters: a heading's underline or a table's border.
_RULE_LINE = re.compile(r"^[ \t]*[=\-~^*+|][ \t=\-~^*+|]*$\n?", re.MULTILINE)


def clean_markup(text: str) -> str:
    """Drop the lines of a plain-text rendering of reStructuredText that are pure markup.

    A line whose visible characters are all from ``= - ~ ^ * + |`` (a heading's underline, a
    table's border) is removed; its heading text stays. Runs of three or more newlines left
    behind shrink to two. Everything else, prose, code and quotes, is kept as it is.
    """
    if not isinstance(text, str):
        raise TypeError(f"clean_markup: text must be a str, got {type(text).__name__}")
    return re.sub(r"\n{3,}", "\n\n", _RULE_LINE.sub("", text))


@dataclass
class CharCorpus:
    """A text as character ids, split 90/10 into training and validation parts.

    ``chars`` is the sorted set of characters, so id i is ``chars[i]`` and the vocabulary size
    is ``len(chars)``.
    """

    text: str
    chars: list[str]
    train_ids: torch.Tensor  # (0.9 · len(text),) int64
    val_ids: torch.Tensor    # the rest

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> torch.Tensor:
        """str -> (len(s),) int64 ids; a character outside the vocabulary raises ValueError."""
        index = {c: i for i, c in enumerate(self.chars)}
        missing = sorted(set(s) - index.keys())
        if missing:
            raise ValueError(f"s contains characters not in the corpus vocabulary: {missing[:10]}")
        return torch.tensor([index[c] for c in s], dtype=torch.long)

    def decode(self, ids) -> str:
        """A sequence of ids (list or 1-d tensor) -> str."""
        return "".join(self.chars[int(i)] for i in ids)

    def batch(self, batch_size: int, length: int, *, split: str = "train",
              generator: torch.Generator | None = None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows: inputs x (b, length) and targets y = x shifted left by one (b, length)."""
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        ids = self.train_ids if split == "train" else self.val_ids
        if length + 1 > len(ids):
            raise ValueError(f"length + 1 = {length + 1} is longer than the {split} text ({len(ids)} characters)")
        starts = torch.randint(0, len(ids) - length, (batch_size,), generator=generator)
        window = torch.stack([ids[s:s + length + 1] for s in starts.tolist()])
        return window[:, :-1].to(device), window[:, 1:].to(device)


def char_corpus(path=None, *, text: str | None = None, val_fraction: float = 0.1,
                clean: bool = False) -> CharCorpus:
    """A character-level corpus from a text file at ``path``, from ``text``, or by default from
    :func:`python_docs_text` (the shipped snapshot, the same on every Python). A missing file
    raises FileNotFoundError (no silent fallback). ``clean=True`` first removes markup-only
    lines (:func:`clean_markup`). The last ``val_fraction`` of the text is the validation part."""
    if path is not None and text is not None:
        raise ValueError("pass path or text, not both")
    if path is not None:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    elif text is None:
        text = python_docs_text()
    if clean:
        text = clean_markup(text)
    if len(text) < 2:
        raise ValueError(f"text must have at least 2 characters, got {len(text)}")
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(len(ids) * (1 - val_fraction))
    return CharCorpus(text, chars, ids[:split], ids[split:])


@dataclass
class RetrievalPrompts:
    """Key-value retrieval among distractors: N (key, value) tokens, then a query key."""

    tokens: torch.Tensor   # (b, N + 1) long: N pair tokens key * n_values + value, then the query
    targets: torch.Tensor  # (b,) long: the value stored with the query's key
    position: torch.Tensor  # (b,) long: where that pair sits in the context (the attention target)
    vocab: int             # n_keys * n_values pair tokens + n_keys query tokens


def key_value_retrieval(batch: int, n_pairs: int = 32, *, n_keys: int = 64, n_values: int = 16,
                        seed: int = 0, group_size: int = 1) -> RetrievalPrompts:
    """Prompts of ``n_pairs`` distinct random keys with random values, and a query for one of them.

    Pair token ``key * n_values + value``; query token ``n_keys * n_values + key``. The other
    n_pairs - 1 pairs are the distractors; a perfect reader puts all its attention on ``position``.

    group_size > 1 makes near-duplicate keys: key ``k`` belongs to group ``k // group_size``,
    and a prompt holds whole groups (n_pairs / group_size of the n_keys / group_size groups,
    every member), so the queried key always has ``group_size - 1`` distractors from its own
    group. A model that embeds a key as group + member (``RetrievalModel(group_size=...)``)
    sees those distractors as half-matches of the query.
    """
    if not 1 <= n_pairs <= n_keys:
        raise ValueError(f"n_pairs must be between 1 and n_keys={n_keys}, got {n_pairs}")
    if group_size < 1 or n_keys % group_size or n_pairs % group_size:
        raise ValueError(f"group_size must be >= 1 and divide n_keys={n_keys} and n_pairs={n_pairs}, "
                         f"got {group_size}")
    g = torch.Generator().manual_seed(seed)
    if group_size == 1:
        keys = torch.rand(batch, n_keys, generator=g).argsort(-1)[:, :n_pairs]       # distinct keys
    else:
        n_groups, take = n_keys // group_size, n_pairs // group_size
        groups = torch.rand(batch, n_groups, generator=g).argsort(-1)[:, :take]     # distinct groups
        members = (groups.unsqueeze(-1) * group_size + torch.arange(group_size)).flatten(1)
        keys = members.gather(1, torch.rand(batch, n_pairs, generator=g).argsort(-1))   # shuffled
    values = torch.randint(n_values, (batch, n_pairs), generator=g)
    position = torch.randint(n_pairs, (batch,), generator=g)
    rows = torch.arange(batch)
    query = n_keys * n_values + keys[rows, position]
    tokens = torch.cat([keys * n_values + values, query.unsqueeze(-1)], dim=-1)
    return RetrievalPrompts(tokens, values[rows, position], position, n_keys * n_values + n_keys)


@dataclass
class MQARBatch:
    """Multi-query associative recall prompts: n_pairs (key, value) pairs, then n_queries of the keys again.

    ``inputs``  k_1 v_1 … k_P v_P  q_1 a_1 … q_Q a_Q, where each q is one of the keys and a its value;
    ``targets`` -100 everywhere except at a query key, where it is that key's value (the next token).
    """

    inputs: torch.Tensor    # (b, L) long, L = 2 (n_pairs + n_queries)
    targets: torch.Tensor   # (b, L) long, -100 where nothing is asked
    vocab: int              # n_keys key tokens 0..n_keys-1, then n_values value tokens

    @property
    def query_mask(self) -> torch.Tensor:
        """(b, L) bool: the positions where a value must be recalled."""
        return self.targets != -100

    def answer_positions(self) -> torch.Tensor:
        """(b, Q) long: where in the context each query's answer sits (position 2j + 1 for pair j)."""
        asked = self.query_mask[0]                                   # every prompt asks at the same positions
        n_pairs = int(asked.nonzero()[0]) // 2
        keys = self.inputs[:, 0:2 * n_pairs:2]
        pair = (self.inputs[:, asked].unsqueeze(-1) == keys.unsqueeze(1)).float().argmax(-1)
        return 2 * pair + 1


def mqar(batch: int, n_pairs: int = 8, *, n_queries: int | None = None, n_keys: int = 64,
         n_values: int = 64, seed: int = 0) -> MQARBatch:
    """Multi-query associative recall, a simplified form of Arora et al. 2023 ("Zoology", §3), seeded.

    Each prompt binds ``n_pairs`` distinct random keys to random values, then asks for
    ``n_queries`` (default ``n_pairs``) distinct keys in a random order. Recall at a query
    needs the value that followed the same key earlier: a lookup over the whole context that
    attention does with one induction-style circuit, while a recurrent model must have kept
    every pair in its fixed state. Keys are tokens ``0 … n_keys − 1``; values
    ``n_keys … n_keys + n_values − 1``.

    How it differs from Zoology's MQAR (:func:`mqar_zoology` is that one):

    - **no power-law gaps**: the queries start right after the last pair and follow each
      other with no filler, so the length is fixed at 2 (n_pairs + n_queries); Zoology spreads
      the queries over a longer tail at distances drawn from a power law, with random filler
      tokens between them;
    - **answers echoed**: each query key is followed by its value (``q_1 a_1 q_2 a_2 …``), so
      the sequence shows the answer to every earlier query; in Zoology the token after a query
      is filler and the value is only a target;
    - **values with replacement**: two keys of a prompt may share a value; Zoology draws the
      values of a prompt without replacement;
    - **vocabulary 128**: 64 keys and 64 values by default (``n_keys``, ``n_values``); Zoology
      takes the vocabulary as an argument (8,192 in the paper), keys from its lower half
      (token 0 excluded), values from its upper half.
    """
    n_queries = n_pairs if n_queries is None else n_queries
    if not 1 <= n_pairs <= n_keys:
        raise ValueError(f"n_pairs must be between 1 and n_keys={n_keys}, got {n_pairs}")
    if not 1 <= n_queries <= n_pairs:
        raise ValueError(f"n_queries must be between 1 and n_pairs={n_pairs}, got {n_queries}")
    if batch < 1 or n_values < 1:
        raise ValueError(f"batch and n_values must be positive, got batch={batch}, n_values={n_values}")
    g = torch.Generator().manual_seed(seed)
    keys = torch.rand(batch, n_keys, generator=g).argsort(-1)[:, :n_pairs]              # distinct per prompt
    values = n_keys + torch.randint(n_values, (batch, n_pairs), generator=g)
    asked = torch.rand(batch, n_pairs, generator=g).argsort(-1)[:, :n_queries]          # which pairs, in what order
    query_keys, query_values = keys.gather(1, asked), values.gather(1, asked)
    context = torch.stack([keys, values], dim=-1).flatten(1)                            # k v k v …
    queries = torch.stack([query_keys, query_values], dim=-1).flatten(1)
    inputs = torch.cat([context, queries], dim=1)
    targets = torch.full_like(inputs, -100)
    targets[:, 2 * n_pairs::2] = query_values                                           # predict a after q
    return MQARBatch(inputs, targets, n_keys + n_values)


@dataclass
class ZoologyMQARBatch(MQARBatch):
    """Zoology's MQAR prompts (:func:`mqar_zoology`): the pairs, then a tail of filler and queries.

    ``gaps[:, j]`` is the gap of pair j: its query sits at position 2 n_pairs + 2 (gap − 1), so
    gap 1 is the first token after the pairs. ``inputs``, ``targets`` and ``vocab`` as in
    :class:`MQARBatch` (targets −100 except at a query, where it is the queried key's value).
    """

    n_pairs: int
    gaps: torch.Tensor       # (b, n_pairs) long, in 1 … (L − 2 n_pairs) / 2, distinct per prompt

    def query_positions(self) -> torch.Tensor:
        """(b, n_pairs) long: where pair j's key is asked, 2 n_pairs + 2 (gaps − 1)."""
        return 2 * self.n_pairs + 2 * (self.gaps - 1)

    def pairs_back(self) -> torch.Tensor:
        """(b, n_pairs) long: how many pairs back from the end of the pairs pair j sits (n_pairs − j;
        1 is the last pair written), the same for every prompt."""
        back = self.n_pairs - torch.arange(self.n_pairs)
        return back.expand(self.gaps.shape[0], -1)

    def answer_positions(self) -> torch.Tensor:
        """(b, n_pairs) long: where the answer of each query sits (2j + 1 for pair j), the queries in
        the order they appear in the prompt (as :meth:`MQARBatch.answer_positions`)."""
        order = self.gaps.argsort(dim=1)
        return 2 * order + 1


def power_law_gaps(space: int, power_a: float = 0.01) -> torch.Tensor:
    r"""Zoology's gap distribution over 1 … ``space``: :math:`p(g) \propto a\, g^{a - 1}`, normalised.

    With Zoology's default :math:`a = 0.01`, :math:`p(g) \propto g^{-0.99}`, nearly 1/g: a query
    lands right after the pairs far more often than at the end of the tail (as the gaps between
    repeated bigrams in text do). :math:`a = 1` gives the uniform distribution. Returns (space,)
    float64 probabilities.
    """
    _checks.ints("power_law_gaps", space=space)
    if not (isinstance(power_a, (int, float)) and 0 < power_a <= 1):
        raise ValueError(f"power_law_gaps: power_a must lie in (0, 1], got {power_a!r}")
    g = torch.arange(1, space + 1, dtype=torch.float64)
    p = power_a * g ** (power_a - 1)
    return p / p.sum()


def mqar_zoology(batch: int, n_pairs: int = 8, seq_len: int = 64, *, vocab: int = 8192, power_a: float = 0.01,
                 random_non_queries: bool = True, seed: int = 0) -> ZoologyMQARBatch:
    r"""Multi-query associative recall as Zoology defines it (Arora et al. 2023, §3 and its code), seeded.

    A prompt of ``seq_len`` tokens: ``n_pairs`` pairs :math:`k_1 v_1 \dots k_P v_P`, then a tail of
    :math:`L - 2P` tokens holding :math:`(L - 2P)/2` slots at its even offsets. Every key is asked
    once: pair j's key goes into slot :math:`g_j - 1`, the gaps :math:`g_j` drawn without
    replacement from :func:`power_law_gaps` (``power_a``), and the target at that position is
    :math:`v_j`. Every other tail token is filler: a uniformly random token of the whole
    vocabulary (``random_non_queries``; a filler token may repeat a key, and asks nothing) or 0.

    Vocabulary: keys are drawn without replacement from ``1 … vocab // 2 − 1`` (token 0 is the
    filler placeholder), values without replacement from ``vocab // 2 … vocab − 1``.

    Needs ``seq_len`` even and ``seq_len ≥ 4 n_pairs`` (as many slots as pairs), and
    ``n_pairs ≤ vocab // 2 − 1``. Returns a :class:`ZoologyMQARBatch`, inputs and targets
    (batch, seq_len).
    """
    _checks.ints("mqar_zoology", batch=batch, n_pairs=n_pairs, seq_len=seq_len, vocab=vocab)
    if seq_len % 2 or seq_len < 4 * n_pairs:
        raise ValueError(f"mqar_zoology: seq_len must be even and at least 4 n_pairs = {4 * n_pairs}, "
                         f"got {seq_len}")
    if n_pairs > vocab // 2 - 1:
        raise ValueError(f"mqar_zoology: vocab must hold n_pairs = {n_pairs} keys in 1 … vocab // 2 − 1, "
                         f"got vocab={vocab}")
    space = (seq_len - 2 * n_pairs) // 2
    p = power_law_gaps(space, power_a)
    g = torch.Generator().manual_seed(seed)
    half = vocab // 2
    keys = 1 + torch.rand(batch, half - 1, generator=g).argsort(-1)[:, :n_pairs]               # distinct
    values = half + torch.rand(batch, vocab - half, generator=g).argsort(-1)[:, :n_pairs]      # distinct
    gaps = 1 + torch.multinomial(p.expand(batch, space), n_pairs, replacement=False, generator=g)
    inputs = torch.zeros(batch, seq_len, dtype=torch.long)
    inputs[:, 0:2 * n_pairs:2], inputs[:, 1:2 * n_pairs:2] = keys, values
    asked = 2 * n_pairs + 2 * (gaps - 1)
    filler = torch.randint(vocab, (batch, seq_len), generator=g)
    if random_non_queries:
        inputs[:, 2 * n_pairs:] = filler[:, 2 * n_pairs:]
    inputs.scatter_(1, asked, keys)
    targets = torch.full_like(inputs, -100).scatter_(1, asked, values)
    return ZoologyMQARBatch(inputs, targets, vocab, n_pairs, gaps)


# ----------------------------------------------------------------------------- chapter 11: selective copying

@dataclass
class SelectiveCopyBatch:
    """Selective-copying prompts: a context of noise with data tokens at random places, then markers.

    ``inputs``   (b, length + n_data) long: the context, then n_data marker tokens;
    ``targets``  (b, length + n_data) long: -100 everywhere except at marker j, whose target is
                 the j-th data token of the context (the model answers in order);
    ``is_data``  (b, length + n_data) bool: where the data tokens sit.
    Token ids: noise ``0 … n_noise − 1``, data ``n_noise … n_noise + n_values − 1``, the marker
    ``n_noise + n_values``; ``vocab`` = n_noise + n_values + 1.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    is_data: torch.Tensor
    vocab: int
    n_noise: int
    marker: int

    @property
    def is_noise(self) -> torch.Tensor:
        """(b, length + n_data) bool: the noise tokens of the context."""
        return self.inputs < self.n_noise

    @property
    def data(self) -> torch.Tensor:
        """(b, n_data) long: the data tokens in order (what the markers must produce)."""
        return self.targets[self.targets != -100].view(self.inputs.shape[0], -1)


def selective_copying(batch: int, n_data: int = 4, length: int = 32, *, n_values: int = 8, n_noise: int = 1,
                      seed: int = 0) -> SelectiveCopyBatch:
    """Selective copying (Gu and Dao 2023, §3.1 and §4.1.1), seeded and small.

    Each prompt scatters ``n_data`` data tokens, drawn uniformly (with replacement) from
    ``n_values`` values, at random distinct positions of a context of ``length`` tokens; every
    other position holds a noise token, drawn uniformly from ``n_noise`` noise ids (one id: a
    blank). Then come ``n_data`` marker tokens, and at the j-th marker the model must output the
    j-th data token. The positions change from prompt to prompt, so a model must decide by
    content which tokens to keep: a time-invariant filter weighs a token by its distance from
    the end, whatever it is.
    """
    _checks.ints("selective_copying", batch=batch, n_data=n_data, length=length, n_values=n_values,
                 n_noise=n_noise)
    if n_data > length:
        raise ValueError(f"selective_copying: n_data must be at most length = {length}, got {n_data}")
    g = torch.Generator().manual_seed(seed)
    context = torch.randint(n_noise, (batch, length), generator=g)
    where = torch.rand(batch, length, generator=g).argsort(-1)[:, :n_data].sort(-1).values
    data = n_noise + torch.randint(n_values, (batch, n_data), generator=g)
    context.scatter_(1, where, data)
    marker = n_noise + n_values
    inputs = torch.cat([context, torch.full((batch, n_data), marker)], dim=1)
    targets = torch.full_like(inputs, -100)
    targets[:, length:] = data
    is_data = torch.zeros_like(inputs, dtype=torch.bool).scatter_(1, where, True)
    return SelectiveCopyBatch(inputs, targets, is_data, marker + 1, n_noise, marker)
