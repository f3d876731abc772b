"""A small causal language model whose only varying part is how it is told about position.

Read alongside: Vaswani et al. 2017, §3.5 (sinusoidal); Radford et al. 2018/2019 (learned
tables); Su et al. 2021, "RoFormer" (RoPE); Press et al. 2022, "Train Short, Test Long"
(ALiBi); Haviv et al. 2022 and Kazemnejad et al. 2023 (no positional encoding, "NoPE").

Every scheme uses the same pre-LN blocks, widths and initialisation; what differs is where
position enters:

==============  ===========================================================
``none``        nowhere: only the causal mask breaks the permutation symmetry
``sinusoidal``  the fixed table :func:`~attnlab.positional.sinusoidal_encoding`, added to the tokens
``learned``     a trainable table (:class:`~attnlab.positional.LearnedPositionalEmbedding`), added to the tokens
``rope``        :func:`~attnlab.positional.apply_rope` on every head's queries and keys, in every layer
``alibi``       :func:`~attnlab.positional.alibi_bias` added to every layer's scores
==============  ===========================================================

Shapes (see the package docstring): ``idx`` (b, L) token ids; the residual stream
(b, L, d_model); attention tensors (b, h, L, d) with d = d_model / h.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .attention import scaled_dot_product_attention
from .blocks import FeedForward, LayerNorm
from .positional import LearnedPositionalEmbedding, alibi_bias, apply_rope, sinusoidal_encoding

SCHEMES = ("none", "sinusoidal", "learned", "rope", "alibi")


@dataclass(frozen=True)
class PositionConfig:
    """Hyper-parameters of :class:`PositionLM`. ``max_len`` sizes the learned table (only)."""

    vocab: int
    scheme: str = "rope"
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    max_len: int = 128
    base: float = 10000.0


class PositionalAttention(nn.Module):
    """Causal multi-head self-attention that applies RoPE or ALiBi when its scheme asks for it."""

    def __init__(self, d_model: int, n_heads: int, scheme: str = "none", base: float = 10000.0):
        super().__init__()
        self.n_heads, self.scheme, self.base = n_heads, scheme, base
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def project(self, x: torch.Tensor):
        """(b, L, d_model) -> q, k, v (b, h, L, d) with RoPE applied, and ALiBi's (h, L, L) bias or None."""
        if x.dim() != 3 or x.shape[-1] != self.qkv.in_features:
            raise ValueError(f"PositionalAttention: x must be (b, L, d_model={self.qkv.in_features}), "
                             f"got {tuple(x.shape)}")
        b, L, _ = x.shape
        q, k, v = self.qkv(x).view(b, L, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
        bias = None
        if self.scheme == "rope":                       # rotate q and k; v is never touched
            q, k = apply_rope(q, base=self.base), apply_rope(k, base=self.base)
        elif self.scheme == "alibi":                    # −slope_h · (i − j), added to q·k/√d
            bias = alibi_bias(self.n_heads, L).to(dtype=x.dtype, device=x.device)
        return q, k, v, bias

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """The (b, h, L, L) scores q_i·k_j/√d (+ ALiBi's bias), before the causal mask and softmax."""
        q, k, _, bias = self.project(x)
        s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        return s if bias is None else s + bias

    def forward(self, x: torch.Tensor, *, return_weights: bool = False):
        """(b, L, d_model) -> (b, L, d_model); with ``return_weights`` also the (b, h, L, L) weights."""
        q, k, v, bias = self.project(x)
        b, L, d_model = x.shape
        y, w = scaled_dot_product_attention(q, k, v, bias, causal=True, return_weights=True)
        y = self.out(y.transpose(1, 2).reshape(b, L, d_model))
        return (y, w) if return_weights else y


class PositionBlock(nn.Module):
    """Pre-LN block: x += attention(LN(x)); x += FFN(LN(x))."""

    def __init__(self, config: PositionConfig):
        super().__init__()
        self.norm1, self.norm2 = LayerNorm(config.d_model), LayerNorm(config.d_model)
        self.attn = PositionalAttention(config.d_model, config.n_heads, config.scheme, config.base)
        self.ffn = FeedForward(config.d_model)

    def forward(self, x: torch.Tensor, *, return_weights: bool = False):
        a, w = self.attn(self.norm1(x), return_weights=True)
        x = x + a
        x = x + self.ffn(self.norm2(x))
        return (x, w) if return_weights else x


class PositionLM(nn.Module):
    r"""Token embedding (+ position, for the absolute schemes), pre-LN blocks, final LN, LM head.

    .. math:: x_0 = E[\text{idx}] \;(+\, PE_{0..L-1}), \quad
              x_\ell = \mathrm{Block}_\ell(x_{\ell-1}), \quad \text{logits} = \mathrm{LN}(x_{N}) W_U^\top

    Token embeddings start at N(0, 1) per coordinate, the size of the sinusoidal table's
    entries (Vaswani et al. scale their embeddings by √d_model for the same reason); the
    learned table starts at N(0, 0.02²) as in GPT-2. A ``learned`` model accepts at most
    ``config.max_len`` positions; rows it never saw in training keep their initial values.
    """

    def __init__(self, config: PositionConfig):
        super().__init__()
        if config.scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {config.scheme!r}")
        if config.d_model % config.n_heads or (config.d_model // config.n_heads) % 2:
            raise ValueError(f"d_model / n_heads must be an even integer, got d_model={config.d_model}, "
                             f"n_heads={config.n_heads}")
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab, config.d_model)          # N(0, 1) by default
        self.pos_emb = (LearnedPositionalEmbedding(config.max_len, config.d_model)
                        if config.scheme == "learned" else None)
        self.blocks = nn.ModuleList(PositionBlock(config) for _ in range(config.n_layers))
        self.norm_f = LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab, bias=False)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """(b, L) ids -> (b, L, d_model): the token embeddings plus any absolute position."""
        x = self.tok_emb(idx)
        if self.config.scheme == "sinusoidal":
            x = x + sinusoidal_encoding(idx.shape[1], self.config.d_model, self.config.base,
                                        dtype=x.dtype).to(x.device)
        elif self.config.scheme == "learned":
            x = self.pos_emb(x)
        return x

    def forward(self, idx: torch.Tensor, *, return_weights: bool = False):
        """(b, L) ids -> logits (b, L, vocab); with ``return_weights`` also each layer's weights."""
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.long, torch.int):
            got = tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise ValueError(f"idx must be an integer tensor of shape (b, L), got {got}")
        x, weights = self.embed(idx), []
        for block in self.blocks:
            x, w = block(x, return_weights=True)
            weights.append(w)
        logits = self.lm_head(self.norm_f(x))
        return (logits, weights) if return_weights else logits
