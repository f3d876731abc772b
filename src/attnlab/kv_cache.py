"""The key/value cache of autoregressive decoding, and what it costs in memory.

Read alongside: Pope et al. 2022, "Efficiently Scaling Transformer Inference" (the KV cache
and its memory); Shazeer 2019, "Fast Transformer Decoding" (MQA); Ainslie et al. 2023, "GQA";
Jiang et al. 2023, "Mistral 7B" (sliding window, rolling buffer cache); DeepSeek-AI 2024,
"DeepSeek-V2" (multi-head latent attention, MLA); Lieber et al. 2024, "Jamba" (table of
KV-cache sizes at 256K tokens).

A decoder that has produced t tokens has already computed the keys and values of those t
tokens in every layer. Keeping them means each new token costs one query against t stored
keys instead of a forward pass over all t tokens again. (Cross-attention's keys and values come
from a fixed context and are computed once: :meth:`attnlab.attention.MultiHeadAttention.context_kv`.)

Shapes (see the package docstring for the glossary):
    k, v      (b, h_kv, n, d)         the keys and values of n new tokens in one layer
    buffers   (b, h_kv, max_len, d)   one preallocated tensor each for K and V, per layer
    returned  (b, h_kv, t, d)         everything cached so far, t = length after the append
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _checks


class LayerKVCache:
    r"""The keys and values of one attention layer, preallocated to ``max_len`` positions.

    :meth:`append` writes the new tokens' K and V at positions ``length .. length + n - 1``
    and returns views of all ``length + n`` of them:

    .. math:: K_{1:t} = \mathrm{concat}(K_{1:t-n}, K_{t-n+1:t}), \qquad V_{1:t} \text{ likewise}

    Writing into a preallocated buffer copies only the n new rows. Growing the cache with
    ``torch.cat`` would copy all t rows at every step: O(t d), the same order as the attention
    read of those rows, so it roughly doubles a step's memory traffic (plus an allocation per
    step) without changing the O(N² d) total. The buffer also fixes the memory from the start.
    """

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device=None):
        for name, value in (("batch", batch), ("n_kv_heads", n_kv_heads), ("max_len", max_len), ("head_dim", head_dim)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.k = torch.zeros(batch, n_kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[-2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (b, h_kv, n, d) after the cached positions; return all (b, h_kv, t, d)."""
        b, h_kv, _, d = self.k.shape
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 4 or t.shape[0] != b or t.shape[1] != h_kv or t.shape[3] != d:
                raise ValueError(f"{name} must have shape (b={b}, h_kv={h_kv}, n, d={d}) to match the cache, "
                                 f"got {tuple(t.shape)}")
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        n = k.shape[2]
        if self.length + n > self.max_len:
            raise ValueError(f"KV cache is full: it holds {self.length} of max_len={self.max_len} positions and "
                             f"cannot take {n} more; preallocate a cache with max_len >= {self.length + n}")
        self.k[:, :, self.length:self.length + n] = k
        self.v[:, :, self.length:self.length + n] = v
        self.length += n
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (speculative decoding rolls back this way)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length must be between 0 and the cached length {self.length}, got {length}")
        self.length = length


class KVCache:
    """One :class:`LayerKVCache` per layer, all preallocated to the same ``max_len``.

    ``cache[i]`` is layer i's cache; ``len(cache)`` the number of layers; ``cache.length``
    the number of positions cached (the same in every layer after a full forward pass).
    With grouped-query attention only the h_kv key/value heads are stored, not the h query
    heads: that is the whole memory saving of GQA and MQA.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device=None):
        if not isinstance(n_layers, int) or n_layers < 1:
            raise ValueError(f"n_layers must be a positive integer, got {n_layers!r}")
        self.layers = [LayerKVCache(batch, n_kv_heads, max_len, head_dim, dtype=dtype, device=device)
                       for _ in range(n_layers)]

    def __getitem__(self, i: int) -> LayerKVCache:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def length(self) -> int:
        return self.layers[0].length

    @property
    def max_len(self) -> int:
        return self.layers[0].max_len

    def truncate(self, length: int) -> None:
        """Roll every layer back to ``length`` positions."""
        for layer in self.layers:
            layer.truncate(length)

    def nbytes(self) -> int:
        """Bytes allocated by the K and V buffers of all layers."""
        return sum(t.numel() * t.element_size() for layer in self.layers for t in (layer.k, layer.v))


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int, batch: int = 1,
                   bytes_per_element: float = 2, *, window: int | None = None) -> float:
    r"""Bytes of a standard (MHA/GQA/MQA) KV cache.

    .. math:: \text{bytes} = 2 \cdot L \cdot h_{kv} \cdot d \cdot \min(N, w) \cdot b \cdot \text{bytes per element}

    (the 2 is K and V). ``n_layers`` counts the layers that *have* a cache (attention layers
    only, in a hybrid). ``window`` is the number of positions a rolling buffer keeps, W (Mistral's
    W, the cache's slots): the query and the W − 1 before it. In :mod:`attnlab.sparse`'s radius
    convention that is a causal window of radius w = W − 1. Llama-2-7B (L = 32, h_kv = 32,
    d = 128) at N = 4096 in fp16 needs exactly 2 GiB.
    """
    for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                        ("seq_len", seq_len), ("batch", batch)):
        if value < 0:
            raise ValueError(f"{name} must be non-negative, got {value}")
    kept = seq_len if window is None else min(seq_len, window)
    return 2 * n_layers * n_kv_heads * head_dim * kept * batch * bytes_per_element


def mla_cache_bytes(n_layers: int, latent_dim: int, rope_dim: int, seq_len: int, batch: int = 1,
                    bytes_per_element: float = 2) -> float:
    r"""Bytes of a multi-head latent attention (MLA) cache, as in DeepSeek-V2.

    .. math:: \text{bytes} = L \cdot (d_c + d_h^R) \cdot N \cdot b \cdot \text{bytes per element}

    Each token stores one compressed latent :math:`c^{KV}` of width d_c, from which every head's
    K and V are re-projected, plus one shared RoPE key of width d_h^R, instead of 2 h_kv d values.
    """
    _checks.at_least("mla_cache_bytes", 0, n_layers=n_layers, latent_dim=latent_dim, rope_dim=rope_dim,
                     seq_len=seq_len, batch=batch)
    return n_layers * (latent_dim + rope_dim) * seq_len * batch * bytes_per_element


@dataclass(frozen=True)
class CacheSpec:
    """What one model keeps per token: a standard K/V cache, or an MLA latent.

    n_layers: layers that hold a cache (in Jamba, its attention layers only);
    latent_dim, rope_dim: set for MLA (then n_kv_heads and head_dim describe the heads the
    latent expands into); window: sliding-window length, if any; version: the release the
    numbers describe, where releases differ (Mistral-7B v0.1 has the window, v0.2 not).
    """

    name: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    n_heads: int
    window: int | None = None
    latent_dim: int | None = None
    rope_dim: int = 0
    source: str = ""
    version: str = ""

    @property
    def label(self) -> str:
        """The name with its version, e.g. "Mistral-7B v0.1" (the key in PRESETS is the name)."""
        return f"{self.name} {self.version}" if self.version else self.name

    @property
    def variant(self) -> str:
        if self.latent_dim is not None:
            return "MLA"
        kind = "MHA" if self.n_kv_heads == self.n_heads else ("MQA" if self.n_kv_heads == 1 else "GQA")
        return kind + (f" + window {self.window}" if self.window else "")

    def bytes(self, seq_len: int, batch: int = 1, bytes_per_element: float = 2) -> float:
        """Cache bytes at ``seq_len`` tokens for ``batch`` sequences."""
        if self.latent_dim is not None:
            return mla_cache_bytes(self.n_layers, self.latent_dim, self.rope_dim, seq_len, batch, bytes_per_element)
        return kv_cache_bytes(self.n_layers, self.n_kv_heads, self.head_dim, seq_len, batch, bytes_per_element,
                              window=self.window)


PRESETS: dict[str, CacheSpec] = {spec.name: spec for spec in (
    CacheSpec("Llama-2-7B", 32, 32, 128, 32, source="Touvron et al. 2023, Llama 2, table 1 / released config"),
    CacheSpec("Llama-3-8B", 32, 8, 128, 32,
              source="Llama Team 2024, The Llama 3 Herd of Models, table 3, and the released config (8 KV heads)"),
    CacheSpec("Mistral-7B", 32, 8, 128, 32, window=4096, version="v0.1",
              source="Jiang et al. 2023, Mistral 7B, table 1: v0.1, sliding window 4096 (v0.2 has no window)"),
    CacheSpec("Mixtral-8x7B", 32, 8, 128, 32, source="Jiang et al. 2024, Mixtral of Experts, table 1"),
    CacheSpec("DeepSeek-V2", 60, 128, 128, 128, latent_dim=512, rope_dim=64,
              source="DeepSeek-AI 2024, DeepSeek-V2, section 2.1 and appendix (d_c = 4 d_h, d_h^R = d_h / 2)"),
    CacheSpec("Jamba-v0.1", 4, 8, 128, 32,
              source="Lieber et al. 2024, Jamba: 32 layers, 1 attention layer in 8, GQA with 8 KV heads"),
)}


def variants(n_layers: int = 32, n_heads: int = 32, head_dim: int = 128, *, window: int = 4096,
             latent_dim: int = 512, rope_dim: int = 64) -> dict[str, CacheSpec]:
    """The same model shape with each kind of cache: MHA, GQA (8 groups), MQA, MLA, sliding window."""
    _checks.ints("variants", n_layers=n_layers, n_heads=n_heads, head_dim=head_dim, window=window,
                 latent_dim=latent_dim)
    _checks.ints("variants", rope_dim=rope_dim, minimum=0)
    return {spec.name: spec for spec in (
        CacheSpec("MHA", n_layers, n_heads, head_dim, n_heads),
        CacheSpec("GQA (8 KV heads)", n_layers, min(8, n_heads), head_dim, n_heads),
        CacheSpec("MQA (1 KV head)", n_layers, 1, head_dim, n_heads),
        CacheSpec(f"MLA (latent {latent_dim} + RoPE {rope_dim})", n_layers, n_heads, head_dim, n_heads,
                  latent_dim=latent_dim, rope_dim=rope_dim),
        CacheSpec(f"MHA + sliding window {window}", n_layers, n_heads, head_dim, n_heads, window=window),
    )}


def decode_flops(prompt_len: int, new_tokens: int, d_model: int, n_layers: int = 1, d_ff: int | None = None, *,
                 cached: bool) -> dict[str, int]:
    r"""Forward FLOPs (2 per multiply-add, matmuls only) to generate ``new_tokens`` after a prompt.

    Step s = 0, ..., T - 1 produces token s + 1 from t = p + s positions (p = prompt_len). Per
    layer, a token costs :math:`c = 8 d^2 + 4 d\, d_{ff}` in projections and feed-forward
    (24 d² with d_ff = 4d) and a query against m keys costs 4 m d in QKᵀ and AV.

    .. math:: \text{uncached: } \sum_{s} \big(c\,t + 4 t^2 d\big) \approx c\,\tfrac{N^2}{2} + \tfrac43 N^3 d,
              \qquad \text{cached: } c\,p + 4p^2 d + \sum_{s \ge 1} \big(c + 4 t d\big) \approx c\,N + 2 N^2 d

    Two simplifications: the masked scores are counted as if computed (4 t² d per uncached step;
    a causal kernel that skips them does half), and the LM head is left out (the uncached loop
    runs it over all t positions unless it keeps only the last, the cached loop over one).

    Returns {"attention": ..., "other": ..., "total": ...} summed over layers.
    """
    if prompt_len < 1 or new_tokens < 0:
        raise ValueError(f"need prompt_len >= 1 and new_tokens >= 0, got {prompt_len} and {new_tokens}")
    d_ff = 4 * d_model if d_ff is None else d_ff
    per_token = 8 * d_model**2 + 4 * d_model * d_ff
    lengths = range(prompt_len, prompt_len + new_tokens)
    if cached:
        first = [(prompt_len, prompt_len)] if new_tokens else []  # prefill: p queries against p keys
        steps = first + [(1, t) for t in lengths[1:]]             # then one query against t keys
    else:
        steps = [(t, t) for t in lengths]
    attention = sum(4 * n * m * d_model for n, m in steps)  # dense QKᵀ and AV, masked entries included
    other = sum(per_token * n for n, _ in steps)
    return {"attention": n_layers * attention, "other": n_layers * other,
            "total": n_layers * (attention + other)}
