"""MicroGPT: a small decoder-only Transformer, and autoregressive generation with a KV cache.

Read alongside: Radford et al. 2018 and 2019 (GPT, GPT-2: learned positions, pre-LN blocks,
a final LayerNorm, tied input and output embeddings); Press & Wolf 2017, "Using the Output
Embedding to Improve Language Models" (weight tying); Xiong et al. 2020 (pre-LN); Pope et al.
2022 (decoding with a KV cache).

Shapes (see the package docstring for the glossary):
    idx      (b, L)             token ids
    x        (b, L, d_model)    the residual stream
    logits   (b, L, V)          V = vocab_size
    weights  (b, h, L, m)       one layer's attention weights, m = positions attended to
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import LayerNorm, TransformerBlock
from .kv_cache import KVCache


@dataclass
class GPTConfig:
    """Hyper-parameters of :class:`MicroGPT` (d_ff defaults to 4 d_model, n_kv_heads to n_heads)."""

    vocab_size: int
    max_len: int = 64
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int | None = None
    d_ff: int | None = None
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True
    final_norm: bool = True


class MicroGPT(nn.Module):
    r"""Token and learned position embeddings, pre-LN blocks, a final LayerNorm and an LM head.

    .. math:: x_0 = E[\text{idx}] + P[\text{pos}], \quad
              x_\ell = x_{\ell-1} + \mathrm{MHA}(\mathrm{LN}(x_{\ell-1})) \text{ then }
              x_\ell \mathrel{+}= \mathrm{FFN}(\mathrm{LN}(x_\ell)), \quad
              \text{logits} = \mathrm{LN}_f(x_L)\, W_U^\top

    with causal self-attention and :math:`W_U = E` when ``tie_weights``. Initialised as GPT-2:
    weights N(0, 0.02²), the projections that write into the residual stream scaled by
    1/√(2 n_layers), biases zero, so the first logits are small and the loss starts near ln V.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(config.d_model, config.n_heads, config.d_ff, norm_position="pre",
                             n_kv_heads=config.n_kv_heads, bias=config.bias, dropout=config.dropout)
            for _ in range(config.n_layers)
        )
        self.norm_f = LayerNorm(config.d_model, bias=config.bias) if config.final_norm else nn.Identity()
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith(("attn.out_proj.weight", "ffn.down.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * config.n_layers))
        if config.tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def new_cache(self, batch: int, max_len: int | None = None, *, dtype: torch.dtype | None = None) -> KVCache:
        """An empty, preallocated :class:`KVCache` for this model (default: ``config.max_len`` positions)."""
        c, attn = self.config, self.blocks[0].attn
        param = self.tok_emb.weight
        return KVCache(c.n_layers, batch, attn.n_kv_heads, c.max_len if max_len is None else max_len, attn.head_dim,
                       dtype=param.dtype if dtype is None else dtype, device=param.device)

    def forward(self, idx: torch.Tensor, *, cache: KVCache | None = None, return_weights: bool = False):
        """Args:
            idx: (b, L) token ids. With a ``cache`` holding t positions, they are positions
                t .. t + L - 1, and their keys and values are appended to it.
            cache: a :class:`KVCache` with one layer per block, or None.
            return_weights: also return a list with each layer's (b, h, L, t + L) weights.

        Returns: logits (b, L, vocab_size), and the list of weights if requested.
        """
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.long, torch.int):
            got = tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise ValueError(f"idx must be an integer tensor of shape (b, L), got {got}")
        start = 0 if cache is None else cache.length
        length = idx.shape[1]
        if start + length > self.config.max_len:
            raise ValueError(f"positions {start}..{start + length - 1} exceed max_len={self.config.max_len}: "
                             f"idx has shape {tuple(idx.shape)}" + (f" after {start} cached positions" if start else ""))
        if cache is not None and len(cache) != len(self.blocks):
            raise ValueError(f"cache has {len(cache)} layers, the model {len(self.blocks)}")
        pos = torch.arange(start, start + length, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        causal = length > 1  # one query (a decoding step) may see every cached key: no mask to build
        all_weights = []
        for i, block in enumerate(self.blocks):
            # TransformerBlock.forward has no cache argument, so its two pre-LN steps are written out here.
            a, weights = block.attn(block.norm1(x), causal=causal, cache=None if cache is None else cache[i],
                                    return_weights=True)
            x = x + block.dropout(a)
            x = x + block.ffn(block.norm2(x))
            all_weights.append(weights)
        logits = self.lm_head(self.norm_f(x))
        return (logits, all_weights) if return_weights else logits


def sample_next(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None, greedy: bool = False,
                generator: torch.Generator | None = None) -> torch.Tensor:
    r"""Pick one token per row from last-position logits (b, V) -> (b, 1).

    .. math:: p = \mathrm{softmax}(z / T) \text{ restricted to the } k \text{ largest } z, \quad
              \text{greedy: } \arg\max_j z_j
    """
    if greedy:
        return logits.argmax(dim=-1, keepdim=True)
    if temperature <= 0:
        raise ValueError(f"temperature must be positive (use greedy=True for argmax), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"sample_next: top_k must be a positive int or None, got {top_k}")
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)


@torch.no_grad()
def generate(model: MicroGPT, idx: torch.Tensor, max_new_tokens: int, *, use_cache: bool = True,
             temperature: float = 1.0, top_k: int | None = None, greedy: bool = False,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Append ``max_new_tokens`` tokens to ``idx`` (b, L), one at a time: (b, L + max_new_tokens).

    Without a cache every step runs the model over the whole sequence so far, O(t² d) attention
    work at step t. With one, the prompt is run once (prefill), then every step runs only the
    newest token against the cached keys and values, O(t d). Both give the same logits up to
    rounding, so greedy decoding gives the same ids. The model runs in eval mode (no dropout);
    its mode is restored afterwards. Prompt plus new tokens must fit in ``config.max_len``
    (learned positions end there); the uncached path crops to the last ``max_len`` tokens.
    """
    if idx.dim() != 2:
        raise ValueError(f"idx must have shape (b, L), got {tuple(idx.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    total, max_len = idx.shape[1] + max_new_tokens, model.config.max_len
    if use_cache and total > max_len:
        raise ValueError(f"prompt of length {idx.shape[1]} plus {max_new_tokens} new tokens = {total} positions, "
                         f"more than max_len={max_len}; shorten one, or use_cache=False to crop the context")
    was_training = model.training
    model.eval()
    try:
        cache = model.new_cache(idx.shape[0], total) if use_cache else None
        step_input = idx
        for _ in range(max_new_tokens):
            if use_cache:
                logits = model(step_input, cache=cache)
            else:
                logits = model(idx[:, -max_len:])
            next_id = sample_next(logits[:, -1], temperature=temperature, top_k=top_k, greedy=greedy,
                                  generator=generator)
            idx = torch.cat([idx, next_id], dim=1)
            step_input = next_id
    finally:
        model.train(was_training)
    return idx
