"""The Transformer block: normalisation, the feed-forward network, residuals, and counting.

Read alongside: Vaswani et al. 2017, section 3; Ba et al. 2016 (LayerNorm); Zhang & Sennrich
2019 (RMSNorm); Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture"
(pre- against post-LN).

Shapes: modules take the residual stream (b, L, d_model); d_ff is the feed-forward width.
"""
from __future__ import annotations

import torch
from torch import nn

from . import _checks
from .attention import MultiHeadAttention


def _check_width(fn: str, x: torch.Tensor, d: int) -> None:
    _checks.floats(fn, x=x)
    if x.dim() == 0 or x.shape[-1] != d:
        raise ValueError(f"{fn}: x must have shape (..., {d}), got {tuple(x.shape)}")


class LayerNorm(nn.Module):
    r"""Layer normalisation over the last axis, written out.

    .. math:: \mathrm{LN}(x) = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta,
              \quad \mu = \tfrac1d \textstyle\sum_i x_i, \quad \sigma^2 = \tfrac1d \sum_i (x_i - \mu)^2

    (The biased variance, and ε inside the square root, as torch.nn.LayerNorm.)
    """

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_width("LayerNorm", x, self.weight.shape[0])
        mu = x.mean(-1, keepdim=True)
        var = (x - mu).square().mean(-1, keepdim=True)
        y = (x - mu) / torch.sqrt(var + self.eps) * self.weight
        return y if self.bias is None else y + self.bias


class RMSNorm(nn.Module):
    r"""Root-mean-square normalisation: LayerNorm without centring or bias.

    .. math:: \mathrm{RMSNorm}(x) = \gamma \odot \frac{x}{\sqrt{\tfrac1d \sum_i x_i^2 + \epsilon}}
    """

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_width("RMSNorm", x, self.weight.shape[0])
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight


class FeedForward(nn.Module):
    r"""The position-wise feed-forward network, :math:`\mathrm{FFN}(x) = \phi(x W_1 + b_1) W_2 + b_2`.

    W_1 is (d_model, d_ff) acting on row vectors (torch stores it as (d_ff, d_model)).
    """

    def __init__(self, d_model: int, d_ff: int | None = None, activation: str = "gelu", bias: bool = True,
                 dropout: float = 0.0):
        super().__init__()
        activations = {"gelu": nn.GELU(), "relu": nn.ReLU()}
        if activation not in activations:
            raise ValueError(f"activation must be one of {sorted(activations)}, got {activation!r}")
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.act = activations[activation]
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_width("FeedForward", x, self.up.in_features)
        return self.dropout(self.down(self.act(self.up(x))))


class TransformerBlock(nn.Module):
    r"""One Transformer block with the normalisation before (pre-LN) or after (post-LN) each sub-layer.

    .. math:: \text{pre-LN:}\quad x \leftarrow x + F(\mathrm{LN}(x)) \qquad
              \text{post-LN:}\quad x \leftarrow \mathrm{LN}(x + F(x))

    for F = self-attention, then F = feed-forward. A pre-LN stack needs one more
    normalisation after its last block (GPT-2 has it).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, *, norm_position: str = "pre",
                 norm: str = "layer", n_kv_heads: int | None = None, bias: bool = True, dropout: float = 0.0,
                 activation: str = "gelu"):
        super().__init__()
        if norm_position not in ("pre", "post"):
            raise ValueError(f"norm_position must be 'pre' or 'post', got {norm_position!r}")
        norms = {"layer": LayerNorm, "rms": RMSNorm}
        if norm not in norms:
            raise ValueError(f"norm must be one of {sorted(norms)}, got {norm!r}")
        self.norm_position = norm_position
        self.norm1, self.norm2 = norms[norm](d_model), norms[norm](d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=bias, dropout=dropout)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, bias=bias, dropout=dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, causal: bool = False) -> torch.Tensor:
        """(b, L, d_model) -> (b, L, d_model)."""
        def attend(h):
            return self.dropout(self.attn(h, mask=mask, causal=causal))

        if self.norm_position == "pre":
            x = x + attend(self.norm1(x))
            return x + self.ffn(self.norm2(x))
        x = self.norm1(x + attend(x))
        return self.norm2(x + self.ffn(x))


def count_parameters(module: nn.Module) -> int:
    """Number of parameters of a module (works on the meta device, where nothing is allocated)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"count_parameters: module must be a torch.nn.Module, got {type(module).__name__}")
    return sum(p.numel() for p in module.parameters())


def approx_transformer_parameters(n_layers: int, d_model: int, vocab: int = 0, n_ctx: int = 0) -> int:
    r"""The rule of thumb :math:`12 L d^2` (4d² attention + 8d² FFN with d_ff = 4d per block),
    plus token (vocab · d) and learned position (n_ctx · d) embeddings. Biases and norms are ignored."""
    _checks.at_least("approx_transformer_parameters", 0, n_layers=n_layers, d_model=d_model, vocab=vocab, n_ctx=n_ctx)
    return 12 * n_layers * d_model**2 + (vocab + n_ctx) * d_model


def block_flops(n: int, d_model: int, d_ff: int | None = None) -> dict[str, int]:
    r"""Forward FLOPs of one block on n tokens, counting 2 per multiply-add (matmuls only).

    Q, K, V projections 6 n d², QKᵀ 2 n² d, AV 2 n² d, output projection 2 n d²,
    feed-forward 4 n d d_ff. With d_ff = 4d the total is 24 n d² + 4 n² d, whatever the
    number of heads.
    """
    d_ff = 4 * d_model if d_ff is None else d_ff
    _checks.at_least("block_flops", 0, n=n, d_model=d_model, d_ff=d_ff)
    parts = {
        "QKV projections": 6 * n * d_model**2,
        "QKᵀ": 2 * n * n * d_model,
        "AV": 2 * n * n * d_model,
        "output projection": 2 * n * d_model**2,
        "feed-forward": 4 * n * d_model * d_ff,
    }
    parts["total"] = sum(parts.values())
    return parts
