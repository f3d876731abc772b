"""Multi-head latent attention (MLA): cache one small latent per token, not h keys and h values.

Read alongside: DeepSeek-AI 2024, "DeepSeek-V2" (section 2.1: low-rank key-value joint
compression and the decoupled rotary key); DeepSeek-AI 2024, "DeepSeek-V3 Technical Report"
(the configuration: d_c = 512, d_rope = 64, h = 128, d_head = 128, 61 layers).

Each token's hidden state is *down*-projected to a latent c (d_c numbers); keys and values are
*up*-projected from it, per head. Position goes through a separate, small rotary key k_rope that
all heads share, because RoPE between W_uk and the query would stop the two from being merged.
Only c and k_rope are cached: d_c + d_rope numbers per token per layer, against 2 h d_head for
multi-head attention. At inference the up-projection of the keys is *absorbed* into the query
(q_lat = q W_uk^T) and the one of the values is applied after attention, so attention runs
directly on the cached latents. Both forms are here and give the same output. Cache sizes
are computed by :func:`attnlab.kv_cache.mla_cache_bytes` and :func:`attnlab.kv_cache.kv_cache_bytes`.

Simplifications: DeepSeek also compresses the queries through a second latent (d_c' = 1536) to
save activation memory in training, and RMS-normalises both latents before their
up-projections; neither changes what is cached, and both are left out here.

Shapes (see the package docstring):
    x        (b, L, d_model)       the residual stream
    c        (b, L, d_c)           cached latent
    k_rope   (b, 1, L, d_rope)     cached rotary key, shared by the h heads
    q        (b, h, L, d_head)     content part of the query; q_rope (b, h, L, d_rope)
    w_uk     (h, d_c, d_head)      up-projection latent -> key of head i; w_uv likewise for values
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .attention import scaled_dot_product_attention
from .positional import apply_rope


class MultiHeadLatentAttention(nn.Module):
    r"""Causal self-attention with a low-rank latent KV cache and a decoupled RoPE key.

    .. math::
        c_t = x_t W_{dkv}, \quad k_{t,i} = c_t W_{uk,i}, \quad
        v_{t,i} = c_t W_{uv,i}, \quad k^R_t = \mathrm{RoPE}(x_t W_{kr}) \\
        q_{t,i} = x_t W_{q,i}, \quad q^R_{t,i} = \mathrm{RoPE}(x_t W_{qr,i}), \\
        s_{ts,i} = \frac{q_{t,i}\cdot k_{s,i} + q^R_{t,i}\cdot k^R_s}
                        {\sqrt{d_h + d_{rope}}}, \quad
        o_{t,i} = \sum_s \mathrm{softmax}_s(s_{ts,i})\, v_{s,i}

    and the output is :math:`[o_{t,1}; \dots; o_{t,h}] W_o`. The absorbed form uses
    :math:`q_{t,i}\cdot k_{s,i} = (q_{t,i} W_{uk,i}^\top)\cdot c_s` and
    :math:`\sum_s a_{ts} v_{s,i} = (\sum_s a_{ts} c_s) W_{uv,i}`.
    """

    def __init__(self, d_model: int, n_heads: int, d_head: int, d_latent: int,
                 d_rope: int):
        super().__init__()
        if d_rope % 2:
            raise ValueError(f"d_rope must be even (RoPE rotates pairs), got {d_rope}")
        self.n_heads, self.d_head = n_heads, d_head
        self.d_latent, self.d_rope = d_latent, d_rope
        self.w_dkv = nn.Linear(d_model, d_latent, bias=False)
        self.w_kr = nn.Linear(d_model, d_rope, bias=False)
        self.w_q = nn.Linear(d_model, n_heads * d_head, bias=False)
        self.w_qr = nn.Linear(d_model, n_heads * d_rope, bias=False)
        init = 1 / math.sqrt(d_latent)
        self.w_uk = nn.Parameter(torch.randn(n_heads, d_latent, d_head) * init)
        self.w_uv = nn.Parameter(torch.randn(n_heads, d_latent, d_head) * init)
        self.w_o = nn.Linear(n_heads * d_head, d_model, bias=False)

    def latent_cache(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What MLA caches: c (b, L, d_c) and the shared RoPE key (b, 1, L, d_rope)."""
        if x.dim() != 3 or x.shape[-1] != self.w_dkv.in_features:
            raise ValueError(f"x must have shape (b, L, {self.w_dkv.in_features}), "
                             f"got {tuple(x.shape)}")
        return self.w_dkv(x), apply_rope(self.w_kr(x).unsqueeze(1))

    def _queries(self, x):
        b, L, _ = x.shape
        q = self.w_q(x).view(b, L, self.n_heads, self.d_head).transpose(1, 2)
        q_rope = self.w_qr(x).view(b, L, self.n_heads, self.d_rope).transpose(1, 2)
        q_rope = apply_rope(q_rope)
        return q, q_rope

    def forward(self, x: torch.Tensor, *, absorbed: bool = False) -> torch.Tensor:
        """(b, L, d_model) -> (b, L, d_model), causal; ``absorbed``: inference form."""
        c, k_rope = self.latent_cache(x)
        q, q_rope = self._queries(x)
        b, L = x.shape[:2]
        scale = 1.0 / math.sqrt(self.d_head + self.d_rope)
        if absorbed:
            # attention on the latents: keys [c, k_rope], values c, shared by all heads
            q_lat = torch.einsum("bhld,hcd->bhlc", q, self.w_uk)      # (b, h, L, d_c)
            keys = torch.cat([c.unsqueeze(1), k_rope], dim=-1)   # (b, 1, L, d_c + d_r)
            out_lat = scaled_dot_product_attention(
                torch.cat([q_lat, q_rope], dim=-1), keys, c.unsqueeze(1),
                causal=True, scale=scale)                             # (b, h, L, d_c)
            heads = torch.einsum("bhlc,hcd->bhld", out_lat, self.w_uv)
        else:
            k = torch.einsum("blc,hcd->bhld", c, self.w_uk)        # (b, h, L, d_head)
            v = torch.einsum("blc,hcd->bhld", c, self.w_uv)
            keys = torch.cat([k, k_rope.expand(-1, self.n_heads, -1, -1)], dim=-1)
            heads = scaled_dot_product_attention(
                torch.cat([q, q_rope], dim=-1), keys, v, causal=True, scale=scale)
        return self.w_o(heads.transpose(1, 2).reshape(b, L, self.n_heads * self.d_head))


def mla_parameters(d_model: int, n_heads: int, d_head: int, d_latent: int, d_rope: int, *,
                   d_q_latent: int | None = None, d_v: int | None = None) -> int:
    r"""Weights of one MLA layer (DeepSeek-V2/V3 form, no biases, the two latent RMSNorm gains counted).

    .. math:: \underbrace{d\,d_q' + d_q' h (d_h + d_{rope})}_{\text{queries (low-rank if } d_q'\text{)}}
              + \underbrace{d (d_c + d_{rope})}_{W_{dkv}, W_{kr}} + d_c h (d_h + d_v) + h d_v d
              \; [+ d_q' + d_c]

    Without ``d_q_latent`` the queries are a full projection, :math:`d\,h(d_h + d_{rope})`
    (as in :class:`MultiHeadLatentAttention`). ``d_v`` defaults to ``d_head``.
    """
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("d_head", d_head), ("d_latent", d_latent),
                        ("d_rope", d_rope)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"mla_parameters: {name} must be a positive int, got {value!r}")
    d_v = d_head if d_v is None else d_v
    q_width = n_heads * (d_head + d_rope)
    queries = d_model * q_width if d_q_latent is None else d_model * d_q_latent + d_q_latent * q_width + d_q_latent
    return (queries + d_model * (d_latent + d_rope) + d_latent + d_latent * n_heads * (d_head + d_v)
            + n_heads * d_v * d_model)
