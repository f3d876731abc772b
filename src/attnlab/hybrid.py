"""Hybrid language models: attention layers mixed with state-space, recurrent and convolutional ones.

Read alongside: Lieber et al. 2024, "Jamba: A Hybrid Transformer-Mamba Language Model" (one
attention layer in eight, MoE every other layer; the released configuration); Glorioso et al.
2024, "Zamba: A Compact 7B SSM Hybrid Model" (one shared attention + MLP block, called 13 times
among Zamba-7B-v1's 76 Mamba blocks, fed the residual stream concatenated with the input
embeddings; each call's output joins the next Mamba block's input, Figure 2 and eq. 6); De et al.
2024, "Griffin" (two RG-LRU blocks to one local multi-query attention block); Poli et al. 2023,
"Hyena Hierarchy", and Together AI 2023, "StripedHyena-7B" (Hyena layers striped with
attention); Dao and Gu 2024, "Transformers are SSMs" (semiseparable matrices, §3-4);
Waleffe et al. 2024, "An Empirical Study of Mamba-based Language Models".

Shape letters (see the package docstring):

    b        batch
    L        sequence length (N in the cost formulas, as in the papers)
    d_model  width of the residual stream (d in the cost formulas)
    V        vocabulary size

A *pattern* is a list of :class:`LayerSpec`, one per residual layer: which sequence mixer it
has and which feed-forward network follows. :class:`HybridLM` builds any pattern at toy size;
the calculators (:func:`parameter_count`, :func:`forward_flops`, :func:`ssm_state_bytes`) work
from the published full-size configurations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import _checks
from .attention import MultiHeadAttention, scaled_dot_product_attention
from .blocks import FeedForward, RMSNorm
from .hyena import HyenaOperator
from .linear import linear_attention
from .moe import MoEFeedForward
from .rglru import GriffinRecurrentBlock
from .sparse import sliding_window_mask
from .ssm import Mamba, MambaConfig, state_size as mamba_state_size

MIXERS = {"attention": "A", "local_attention": "W", "linear_attention": "L", "mamba": "M", "rglru": "R",
          "hyena": "H", "shared_attention": "S", "short_conv": "C"}
FFNS = {None: "·", "mlp": "f", "moe": "E"}


@dataclass(frozen=True)
class LayerSpec:
    """One residual layer: a sequence mixer (a key of ``MIXERS``) and a feed-forward network (``None``, "mlp", "moe")."""

    mixer: str
    ffn: str | None = "mlp"

    def __post_init__(self):
        if self.mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {sorted(MIXERS)}, got {self.mixer!r}")
        if self.ffn not in FFNS:
            raise ValueError(f"ffn must be one of {list(FFNS)}, got {self.ffn!r}")


# ---------------------------------------------------------------------------------------------
# Layer patterns of published models
# ---------------------------------------------------------------------------------------------

def jamba_pattern(n_layers: int = 32, attn_period: int = 8, attn_offset: int = 4, expert_period: int = 2,
                  expert_offset: int = 1) -> list[LayerSpec]:
    r"""Jamba's layers (released config of Jamba-v0.1): layer l is attention when
    :math:`l \bmod 8 = 4`, Mamba otherwise; its FFN is a mixture of experts when :math:`l \bmod 2 = 1`.

    32 layers give attention at 4, 12, 20, 28: 4 attention : 28 Mamba = 1 : 7, r = 1/8.
    """
    _checks.ints("jamba_pattern", n_layers=n_layers)
    _checks.ints("jamba_pattern", attn_period=attn_period, expert_period=expert_period)
    if not 0 <= attn_offset < attn_period:
        raise ValueError(f"jamba_pattern: attn_offset must lie in [0, attn_period={attn_period}), got {attn_offset}")
    if not 0 <= expert_offset < expert_period:
        raise ValueError(f"jamba_pattern: expert_offset must lie in [0, expert_period={expert_period}), "
                         f"got {expert_offset}")
    return [LayerSpec("attention" if l % attn_period == attn_offset else "mamba",
                      "moe" if l % expert_period == expert_offset else "mlp") for l in range(n_layers)]


def zamba_shared_layers(n_mamba: int = 76, shared_every: int = 6, offset: int | None = None) -> list[int]:
    r"""The Mamba layers whose input receives a call of Zamba's shared block, as Zamba-7B-v1 places them.

    The released model's configuration (Hugging Face ``ZambaConfig``: 76 layers,
    ``attn_layer_period`` 6, ``attn_layer_offset`` 4, and ``_layers_block_type``, which makes
    layer 2 a call site and then every layer :math:`l \ge 3` with :math:`(l - 3) \bmod 6 = 4`)
    gives 2, 7, 13, 19, …, 73: **13** calls. ``offset`` defaults to ``shared_every − 2``
    (mod ``shared_every``), which is 4 for 6; layers beyond ``n_mamba`` are dropped.
    """
    _checks.ints("zamba_shared_layers", n_mamba=n_mamba, shared_every=shared_every)
    offset = (shared_every - 2) % shared_every if offset is None else offset
    if not 0 <= offset < shared_every:
        raise ValueError(f"zamba_shared_layers: offset must lie in [0, shared_every={shared_every}), got {offset}")
    return [l for l in range(n_mamba) if l == 2 or (l >= 3 and (l - 3) % shared_every == offset)]


def zamba_pattern(n_mamba: int = 76, shared_every: int = 6, offset: int | None = None) -> list[LayerSpec]:
    """Zamba: Mamba blocks without their own MLP, and one *shared* attention + MLP block (the same
    weights at every call) called in front of the Mamba layers :func:`zamba_shared_layers` lists.

    A ``LayerSpec("shared_attention", None)`` entry stands for one call; it is placed just before
    the Mamba layer whose input its output joins (:class:`HybridLM`). Zamba-7B-v1: 76 Mamba layers,
    13 calls (at Mamba layers 2, 7, 13, …, 73), 89 entries.
    """
    if not isinstance(n_mamba, int) or n_mamba < 1:
        raise ValueError(f"zamba_pattern: n_mamba must be a positive int, got {n_mamba!r}")
    calls = set(zamba_shared_layers(n_mamba, shared_every, offset))
    pattern = []
    for l in range(n_mamba):
        if l in calls:
            pattern.append(LayerSpec("shared_attention", None))
        pattern.append(LayerSpec("mamba", None))
    return pattern


def griffin_pattern(n_layers: int = 12, recurrent_per_attention: int = 2) -> list[LayerSpec]:
    """Griffin / RecurrentGemma: residual blocks cycling (RG-LRU, RG-LRU, local MQA), each with an MLP."""
    _checks.ints("griffin_pattern", n_layers=n_layers)
    _checks.ints("griffin_pattern", recurrent_per_attention=recurrent_per_attention, minimum=0)
    period = recurrent_per_attention + 1
    return [LayerSpec("local_attention" if l % period == recurrent_per_attention else "rglru")
            for l in range(n_layers)]


def striped_hyena_pattern(n_layers: int = 32, attention_layers=None) -> list[LayerSpec]:
    """StripedHyena: Hyena layers striped with attention layers, each with an MLP.

    Default: StripedHyena-7B's released configuration, attention on the odd layers (16 of 32,
    1 : 1). ``attention_layers`` picks others (the Evo-style configuration uses 8, 16, 24).
    """
    _checks.ints("striped_hyena_pattern", n_layers=n_layers)
    chosen = set(range(1, n_layers, 2)) if attention_layers is None else set(attention_layers)
    if any(not 0 <= l < n_layers for l in chosen):
        raise ValueError(f"attention_layers must lie in [0, {n_layers}), got {sorted(chosen)}")
    return [LayerSpec("attention" if l in chosen else "hyena") for l in range(n_layers)]


def uniform_pattern(mixer: str, n_layers: int, ffn: str | None = "mlp") -> list[LayerSpec]:
    """n_layers identical layers: a Transformer ("attention"), a pure Mamba stack ("mamba", ffn None), ..."""
    _checks.ints("uniform_pattern", n_layers=n_layers)
    return [LayerSpec(mixer, ffn) for _ in range(n_layers)]


def _check_pattern(fn: str, pattern) -> list[LayerSpec]:
    """The pattern as a list; it must hold at least one LayerSpec and nothing else."""
    pattern = list(pattern)
    if not pattern:
        raise ValueError(f"{fn}: pattern must have at least one layer, got an empty pattern")
    wrong = [s for s in pattern if not isinstance(s, LayerSpec)]
    if wrong:
        raise TypeError(f"{fn}: pattern must be a list of LayerSpec, got a {type(wrong[0]).__name__} in it")
    return pattern


def pattern_string(pattern: list[LayerSpec]) -> tuple[str, str]:
    """Two strings, one letter per layer: the mixers (A attention, W local attention, L linear
    attention, M Mamba, R RG-LRU, H Hyena, S shared attention, C short convolution) and the FFNs
    (f MLP, E experts, · none)."""
    pattern = _check_pattern("pattern_string", pattern)
    return "".join(MIXERS[s.mixer] for s in pattern), "".join(FFNS[s.ffn] for s in pattern)


def attention_fraction(pattern: list[LayerSpec], *, include_local: bool = False) -> float:
    r"""r = (attention layers) / (sequence-mixing layers); local attention counts only if asked.

    A call of Zamba's shared block (a ``shared_attention`` entry) counts as an attention layer in
    the numerator, but it is not a layer of its own: the denominator counts only the layers
    with their own mixer. Zamba-7B-v1 (13 calls among 76 Mamba layers) gives 13/76 = 0.171;
    Jamba-v0.1 gives 4/32 = 1/8; Griffin gives 0, or 1/3 with ``include_local``.
    """
    pattern = _check_pattern("attention_fraction", pattern)
    kinds = {"attention", "shared_attention"} | ({"local_attention"} if include_local else set())
    layers = sum(s.mixer != "shared_attention" for s in pattern)
    if not layers:
        raise ValueError("attention_fraction: pattern has no layer besides shared-block calls")
    return sum(s.mixer in kinds for s in pattern) / layers


# ---------------------------------------------------------------------------------------------
# The toy model
# ---------------------------------------------------------------------------------------------

@dataclass
class HybridConfig:
    """Sizes of a toy :class:`HybridLM`. ``window`` is the causal window of local attention
    (keys t − w … t); local attention uses one key/value head (MQA), as Griffin does."""

    vocab: int = 64
    d_model: int = 32
    n_heads: int = 4
    n_kv_heads: int | None = None
    window: int = 8
    d_ff: int | None = None
    d_state: int = 8
    expand: int = 2
    n_experts: int = 4
    top_k: int = 2
    hyena_state: int = 2
    mamba_method: str = "chunked"
    max_len: int | None = None       # learned absolute positions for up to max_len tokens (None: no positions)


def _attention_step(attn: MultiHeadAttention, x_t: torch.Tensor, cache, keep: int | None = None):
    r"""One token of causal attention from a key/value cache.

    The new token's key and value are appended to the cache, and its query attends to every
    cached position (all of them are in its past, so no mask is needed):

    .. math:: K \leftarrow [K; x_t W^K], \quad V \leftarrow [V; x_t W^V], \qquad
              o_t = \mathrm{softmax}\big(q_t K^\top / \sqrt{d_h}\big) V

    Args: x_t (b, d_in); cache (K, V), each (b, h_kv, t, d_h); keep: how many positions to keep
    after the step (a causal window w keeps the last w: the next token reads them and itself),
    None for all. Returns (out (b, d_out), the new cache).
    """
    q = attn.split_heads(attn.q_proj(x_t.unsqueeze(1)), attn.n_heads)            # (b, h, 1, d_h)
    k_new, v_new = attn.context_kv(x_t.unsqueeze(1))                             # (b, h_kv, 1, d_h)
    k, v = torch.cat([cache[0], k_new], dim=2), torch.cat([cache[1], v_new], dim=2)
    out = attn.out_proj(attn.merge_heads(scaled_dot_product_attention(q, k, v))).squeeze(1)
    if keep is not None:
        k, v = k[:, :, k.shape[2] - min(keep, k.shape[2]):], v[:, :, v.shape[2] - min(keep, v.shape[2]):]
    return out, (k, v)


def _empty_cache(attn: MultiHeadAttention, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An empty K/V cache (b, h_kv, 0, d_h) each, in the weights' dtype."""
    _checks.ints("init_state", batch=batch)
    empty = attn.k_proj.weight.new_zeros(batch, attn.n_kv_heads, 0, attn.head_dim)
    return empty, empty.clone()


def _check_step(fn: str, x_t: torch.Tensor, d: int, name: str = "x_t") -> None:
    if not isinstance(x_t, torch.Tensor) or x_t.dim() != 2 or x_t.shape[-1] != d:
        got = tuple(x_t.shape) if isinstance(x_t, torch.Tensor) else type(x_t).__name__
        raise ValueError(f"{fn}: {name} must be one token per sequence, (b, d_model={d}), got {got}")


class CausalSelfAttention(nn.Module):
    r"""Causal multi-head self-attention, optionally limited to a causal window: keys :math:`t - w \le s \le t`."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, window: int | None = None):
        super().__init__()
        self.window = window
        self.attn = MultiHeadAttention(d_model, n_heads, n_kv_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = None if self.window is None else sliding_window_mask(x.shape[1], self.window, causal=True).to(x.device)
        return self.attn(x, mask=mask, causal=True)

    def init_state(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """An empty K/V cache for decoding: K and V, each (b, h_kv, 0, d_h)."""
        return _empty_cache(self.attn, batch)

    def step(self, x_t: torch.Tensor, cache):
        """One token: x_t (b, d_model) and the K/V cache → (out_t (b, d_model), the cache with x_t's K and V).

        Global attention keeps every position, so the cache grows by one per token; a causal
        window keeps only the last w."""
        _check_step("CausalSelfAttention.step", x_t, self.attn.q_proj.in_features)
        return _attention_step(self.attn, x_t, cache, self.window)


class CausalLinearAttention(nn.Module):
    r"""Causal linear attention with elu + 1 features (``attnlab.linear``), one state per head:

    .. math:: o_t = \frac{\phi(q_t)^\top S_t}{\phi(q_t)^\top z_t}, \quad S_t = S_{t-1} + \phi(k_t) v_t^\top, \quad z_t = z_{t-1} + \phi(k_t)

    computed in the chunked form. State at inference: h (d_h² + d_h) numbers, whatever the length.
    """

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.qkv.in_features:
            raise ValueError(f"CausalLinearAttention: x must be (b, L, d_model={self.qkv.in_features}), "
                             f"got {tuple(x.shape)}")
        b, length, d = x.shape
        q, k, v = (t.view(b, length, self.n_heads, self.head_dim).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        out = linear_attention(q, k, v, causal=True, method="chunked")
        return self.out_proj(out.transpose(1, 2).reshape(b, length, d))

    def init_state(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Empty decoding state: S (b, h, d_h, d_h) and z (b, h, d_h), zeros."""
        _checks.ints("CausalLinearAttention.init_state", batch=batch)
        w = self.qkv.weight
        return (w.new_zeros(batch, self.n_heads, self.head_dim, self.head_dim),
                w.new_zeros(batch, self.n_heads, self.head_dim))

    def step(self, x_t: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]):
        r"""One token: :math:`S_t = S_{t-1} + \phi(k_t) v_t^\top`, :math:`z_t = z_{t-1} + \phi(k_t)`,
        :math:`o_t = \phi(q_t)^\top S_t / \phi(q_t)^\top z_t`. x_t (b, d_model) → (out_t (b, d_model), new state)."""
        _check_step("CausalLinearAttention.step", x_t, self.qkv.in_features)
        b = x_t.shape[0]
        q, k, v = (t.view(b, self.n_heads, self.head_dim) for t in self.qkv(x_t).chunk(3, -1))
        S, z = state
        fq, fk = F.elu(q) + 1, F.elu(k) + 1
        S, z = S + fk.unsqueeze(-1) * v.unsqueeze(-2), z + fk
        out = (fq.unsqueeze(-2) @ S).squeeze(-2) / (fq * z).sum(-1, keepdim=True).clamp_min(1e-12)
        return self.out_proj(out.reshape(b, -1)), (S, z)

    def state_size(self) -> int:
        return self.n_heads * (self.head_dim**2 + self.head_dim)


class ShortConv(nn.Module):
    r"""Mamba's mixer without its selective scan: a short causal depthwise convolution, gated.

    .. math:: [x; z] = W_\text{in} u, \qquad y = W_\text{out}\big(\mathrm{SiLU}(\mathrm{conv1d}(x))
              \odot \mathrm{SiLU}(z)\big)

    with the width-``d_conv`` kernel of :class:`attnlab.ssm.Mamba` over :math:`d_\text{inner}` =
    expand · d_model channels. A token sees only the last d_conv − 1 tokens, so its state at
    inference is :math:`d_\text{inner}(d_\text{conv} - 1)` numbers. In front of an attention layer
    it supplies the previous-token information an induction circuit needs (the recall lab's
    "conv_attention" ablation of the hybrid).
    """

    def __init__(self, d_model: int, expand: int = 2, d_conv: int = 4):
        super().__init__()
        _checks.ints("ShortConv", d_model=d_model, expand=expand, d_conv=d_conv)
        self.d_model, self.d_inner, self.d_conv = d_model, expand * d_model, d_conv
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=False)
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, d_conv, groups=self.d_inner, padding=d_conv - 1)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        if u.dim() != 3 or u.shape[-1] != self.d_model:
            raise ValueError(f"ShortConv: u must be (b, L, d_model={self.d_model}), got {tuple(u.shape)}")
        x, z = self.in_proj(u).chunk(2, dim=-1)
        x = F.silu(self.conv1d(x.transpose(1, 2))[..., :u.shape[1]]).transpose(1, 2)     # causal
        return self.out_proj(x * F.silu(z))

    def state_size(self) -> int:
        return self.d_inner * (self.d_conv - 1)

    def init_state(self, batch: int) -> torch.Tensor:
        """Empty decoding state: the last d_conv − 1 inputs of the convolution, (b, d_inner, d_conv − 1)."""
        _checks.ints("ShortConv.init_state", batch=batch)
        return self.in_proj.weight.new_zeros(batch, self.d_inner, self.d_conv - 1)

    def step(self, u_t: torch.Tensor, state: torch.Tensor):
        """One token: u_t (b, d_model) and the last d_conv − 1 inputs → (out_t (b, d_model), new state)."""
        _check_step("ShortConv.step", u_t, self.d_model, "u_t")
        x, z = self.in_proj(u_t).chunk(2, dim=-1)
        window = torch.cat([state, x.unsqueeze(-1)], dim=-1)                          # (b, d_inner, d_conv)
        x = F.silu((window * self.conv1d.weight.squeeze(1)).sum(-1) + self.conv1d.bias)
        return self.out_proj(x * F.silu(z)), window[..., 1:]


class SharedAttentionBlock(nn.Module):
    r"""Zamba's shared block (Glorioso et al. 2024, Figure 2 and eq. 6): attention on the
    concatenation of the residual stream x and the input embeddings e, then an MLP, with no
    residual connection inside the block.

    .. math:: a = \mathrm{Attn}\big(\mathrm{RMSNorm}([x; e])\big) \in \mathbb R^{d}, \qquad
              \text{out} = \mathrm{MLP}(\mathrm{RMSNorm}(a))

    Queries, keys and values are projections of the 2d-wide input; the output projection maps
    back to d. One instance is called at several depths; each call site applies its own d × d
    linear map :math:`W_l` to the output and adds the result to the *input of the next Mamba
    layer*, not to the residual stream (:class:`HybridLM`). This is the wiring of Zyphra's
    reference implementation (Hugging Face ``ZambaAttentionDecoderLayer`` and
    ``ZambaHybridLayer``). One simplification: Zamba's MLP is gated,
    :math:`(\mathrm{GeLU}(aW_g) \odot aW_u)W_d`; here it is the two-matrix
    :class:`attnlab.blocks.FeedForward`.

    Args: x, embeddings (b, L, d_model). Returns (b, L, d_model).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None):
        super().__init__()
        self.norm_in = RMSNorm(2 * d_model)
        self.attn = MultiHeadAttention(2 * d_model, n_heads)
        self.attn.out_proj = nn.Linear(2 * d_model, d_model, bias=False)          # 2d heads → d
        self.norm_ff = RMSNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff)

    def forward(self, x: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        if embeddings.shape != x.shape:
            raise ValueError(f"SharedAttentionBlock: embeddings must have x's shape {tuple(x.shape)}, "
                             f"got {tuple(embeddings.shape)}")
        a = self.attn(self.norm_in(torch.cat([x, embeddings], dim=-1)), causal=True)
        return self.ffn(self.norm_ff(a))

    def init_state(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """An empty K/V cache for one call site (each call site keeps its own keys and values, 2d wide)."""
        return _empty_cache(self.attn, batch)

    def step(self, x_t: torch.Tensor, e_t: torch.Tensor, cache):
        """One token at one call site: x_t, e_t (b, d_model) and that site's cache → (out_t (b, d_model), cache)."""
        d = self.norm_ff.weight.shape[0]
        _check_step("SharedAttentionBlock.step", x_t, d)
        _check_step("SharedAttentionBlock.step", e_t, d, "e_t")
        a, cache = _attention_step(self.attn, self.norm_in(torch.cat([x_t, e_t], dim=-1)), cache)
        return self.ffn(self.norm_ff(a)), cache


def build_mixer(kind: str, config: HybridConfig) -> nn.Module:
    """A sequence mixer (b, L, d_model) → (b, L, d_model) of the given kind, at the config's size."""
    c = config
    if kind == "attention":
        return CausalSelfAttention(c.d_model, c.n_heads, c.n_kv_heads)
    if kind == "local_attention":
        return CausalSelfAttention(c.d_model, c.n_heads, 1, window=c.window)
    if kind == "linear_attention":
        return CausalLinearAttention(c.d_model, c.n_heads)
    if kind == "mamba":
        return Mamba(MambaConfig(d_model=c.d_model, d_state=c.d_state, expand=c.expand, method=c.mamba_method))
    if kind == "rglru":
        return GriffinRecurrentBlock(c.d_model)
    if kind == "hyena":
        return HyenaOperator(c.d_model, filter_state=c.hyena_state)
    if kind == "short_conv":
        return ShortConv(c.d_model, c.expand)
    raise ValueError(f"kind must be one of {sorted(set(MIXERS) - {'shared_attention'})}, got {kind!r}")


class HybridLayer(nn.Module):
    r"""One pre-norm residual layer: :math:`x \leftarrow x + \mathrm{Mixer}(\mathrm{RMSNorm}(x + s))`, then
    :math:`x \leftarrow x + \mathrm{FFN}(\mathrm{RMSNorm}(x))` if the layer has one.

    s is 0 except after a Zamba call site: a shared-attention layer computes
    :math:`s = W_l\, \mathrm{Shared}(x, e)` with its own :math:`W_l` (:meth:`shared_output`),
    and the next layer adds it to its mixer's input only; the residual stream itself passes the
    call site unchanged (Zamba, eq. 6).
    """

    def __init__(self, spec: LayerSpec, config: HybridConfig, shared: SharedAttentionBlock | None = None):
        super().__init__()
        self.spec = spec
        d = config.d_model
        if spec.mixer == "shared_attention":
            if shared is None:
                raise ValueError("HybridLayer: a shared_attention layer needs shared, "
                                 "the SharedAttentionBlock it calls")
            if spec.ffn is not None:
                raise ValueError(f"HybridLayer: a shared_attention layer has its MLP inside the shared "
                                 f"block; its ffn must be None, got {spec.ffn!r}")
            self.shared, self.proj = shared, nn.Linear(d, d, bias=False)
        else:
            self.norm, self.mixer = RMSNorm(d), build_mixer(spec.mixer, config)
        if spec.ffn is not None:
            d_ff = config.d_ff or 4 * d
            self.ffn_norm = RMSNorm(d)
            self.ffn = (MoEFeedForward(d, d_ff, config.n_experts, config.top_k) if spec.ffn == "moe"
                        else FeedForward(d, d_ff))

    def shared_output(self, x: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        r"""A call site's contribution :math:`W_l\, \mathrm{Shared}(x, e)`, (b, L, d_model)."""
        if self.spec.mixer != "shared_attention":
            raise ValueError(f"HybridLayer.shared_output: this layer's mixer is {self.spec.mixer!r}, "
                             f"not 'shared_attention'")
        return self.proj(self.shared(x, embeddings))

    def forward(self, x: torch.Tensor, embeddings: torch.Tensor, inject: torch.Tensor | None = None) -> torch.Tensor:
        """x (b, L, d_model) → (b, L, d_model); ``inject``: a preceding call site's output, added to
        the mixer's input only. A shared-attention layer returns x unchanged (see :class:`HybridLM`)."""
        if self.spec.mixer == "shared_attention":
            return x
        x = x + self.mixer(self.norm(x if inject is None else x + inject))
        if self.spec.ffn is not None:
            x = x + self.ffn(self.ffn_norm(x))
        return x

    def init_state(self, batch: int):
        """This layer's empty decoding state: a K/V cache (attention, a shared-block call) or a fixed state."""
        return (self.shared if self.spec.mixer == "shared_attention" else self.mixer).init_state(batch)

    def step(self, x_t: torch.Tensor, e_t: torch.Tensor, state, inject: torch.Tensor | None = None):
        """One token, x_t and e_t (b, d_model): as :meth:`forward` at the last position, from ``state``.

        Returns (x_t, new state) for a layer; for a shared-attention call site (s_t, new state),
        where s_t = W_l Shared(x_t, e_t) is the next layer's ``inject``."""
        if self.spec.mixer == "shared_attention":
            out, state = self.shared.step(x_t, e_t, state)
            return self.proj(out), state
        y, state = self.mixer.step(self.norm(x_t if inject is None else x_t + inject), state)
        x_t = x_t + y
        if self.spec.ffn is not None:
            x_t = x_t + self.ffn(self.ffn_norm(x_t))
        return x_t, state


class HybridLM(nn.Module):
    """A language model of any layer pattern: tokens (b, L) → logits (b, L, V).

    ``pattern`` is a list of :class:`LayerSpec` (or a pattern builder's output). A Zamba-style
    pattern's shared-attention layers all call one :class:`SharedAttentionBlock`, counted once
    by ``parameters()``. After a forward pass, :meth:`aux_loss` is the sum of the MoE layers'
    Switch losses (0 without MoE).
    """

    def __init__(self, pattern: list[LayerSpec], config: HybridConfig | None = None):
        super().__init__()
        self.pattern, self.config = _check_pattern("HybridLM", pattern), config or HybridConfig()
        c = self.config
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.position = nn.Embedding(c.max_len, c.d_model) if c.max_len else None
        needs_shared = any(s.mixer == "shared_attention" for s in pattern)
        spec = self.pattern
        dangling = [i for i, s in enumerate(spec) if s.mixer == "shared_attention"
                    and (i + 1 == len(spec) or spec[i + 1].mixer == "shared_attention")]
        if dangling:
            raise ValueError(f"HybridLM: a shared_attention entry must be followed by the layer whose input it "
                             f"feeds; pattern entry {dangling[0]} is not")
        self.shared = SharedAttentionBlock(c.d_model, c.n_heads, c.d_ff) if needs_shared else None
        self.layers = nn.ModuleList(HybridLayer(s, c, self.shared) for s in pattern)
        self.norm_f = RMSNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)

    def hidden_states(self, embeddings: torch.Tensor) -> list[torch.Tensor]:
        r"""The residual stream after each layer, from the embeddings (b, L, d_model): a list of (b, L, d_model).

        A shared-attention entry leaves the stream unchanged and hands
        :math:`s = W_l\,\mathrm{Shared}(x, e)` to the next layer, which adds it to its mixer's input.
        """
        x, out, inject = embeddings, [], None
        for layer in self.layers:
            if layer.spec.mixer == "shared_attention":
                inject = layer.shared_output(x, embeddings)
            else:
                x, inject = layer(x, embeddings, inject), None
            out.append(x)
        return out

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings, plus learned positions if ``config.max_len`` is set: (b, L) → (b, L, d_model)."""
        if tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(f"tokens must be integer (b, L), got {tuple(tokens.shape)} {tokens.dtype}")
        embeddings = self.embed(tokens)
        if self.position is not None:
            if tokens.shape[1] > self.position.num_embeddings:
                raise ValueError(f"tokens has length {tokens.shape[1]}; config.max_len is {self.position.num_embeddings}")
            embeddings = embeddings + self.position.weight[: tokens.shape[1]]
        return embeddings

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm_f(self.hidden_states(self.embed_tokens(tokens))[-1]))

    # -- decoding, one token at a time --------------------------------------------------------

    def init_state(self, batch: int) -> dict:
        """The empty decoding state of ``batch`` sequences: {"position": 0, "layers": one state per
        pattern entry}, each a K/V cache (attention layers, shared-block calls) or a fixed-size state
        (Mamba, RG-LRU, Hyena, linear attention, short convolution)."""
        _checks.ints("HybridLM.init_state", batch=batch)
        return {"position": 0, "layers": [layer.init_state(batch) for layer in self.layers]}

    def step(self, tokens_t: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        r"""Decode one token per sequence: tokens_t (b,) and the state → (logits (b, V), the new state).

        Every layer runs its own step: attention appends the token's key and value to its cache
        and reads the whole cache (the window's last w for local attention); Mamba, the RG-LRU
        block and Hyena update a state whose size does not depend on t. The logits equal
        ``forward``'s at the same position (tested for every mixer and the published patterns).
        """
        if not isinstance(tokens_t, torch.Tensor) or tokens_t.dim() != 1 or tokens_t.is_floating_point():
            got = tuple(tokens_t.shape) if isinstance(tokens_t, torch.Tensor) else type(tokens_t).__name__
            raise ValueError(f"HybridLM.step: tokens_t must be integer ids (b,), one per sequence, got {got}")
        if not (isinstance(state, dict) and set(state) == {"position", "layers"}
                and len(state["layers"]) == len(self.layers)):
            raise TypeError("HybridLM.step: state must be the dict init_state(batch) returned "
                            f"({len(self.layers)} layer states), got {type(state).__name__}")
        t = state["position"]
        e_t = self.embed(tokens_t)
        if self.position is not None:
            if t >= self.position.num_embeddings:
                raise ValueError(f"HybridLM.step: position {t} is past config.max_len = {self.position.num_embeddings}")
            e_t = e_t + self.position.weight[t]
        x_t, inject, new = e_t, None, []
        for layer, layer_state in zip(self.layers, state["layers"]):
            if layer.spec.mixer == "shared_attention":
                inject, layer_state = layer.step(x_t, e_t, layer_state)
            else:
                (x_t, layer_state), inject = layer.step(x_t, e_t, layer_state, inject), None
            new.append(layer_state)
        return self.head(self.norm_f(x_t)), {"position": t + 1, "layers": new}

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """The logits of ``forward`` computed one token at a time with :meth:`step`: (b, L) → (b, L, V)."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
            got = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"HybridLM.decode: tokens must be integer (b, L), got {got}")
        state, out = self.init_state(tokens.shape[0]), []
        for t in range(tokens.shape[1]):
            logits, state = self.step(tokens[:, t], state)
            out.append(logits)
        return torch.stack(out, dim=1)

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, *, use_cache: bool = True) -> torch.Tensor:
        """Greedy continuation of ``prompt`` (b, L) by ``max_new_tokens`` tokens → (b, L + max_new_tokens).

        ``use_cache=True`` decodes with :meth:`step` (caches and states); ``False`` reruns ``forward``
        on the whole sequence for every new token, the reference the cached path must equal."""
        if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.shape[1] < 1 or prompt.is_floating_point():
            got = tuple(prompt.shape) if isinstance(prompt, torch.Tensor) else type(prompt).__name__
            raise ValueError(f"HybridLM.generate: prompt must be integer (b, L) with L >= 1, got {got}")
        _checks.ints("HybridLM.generate", max_new_tokens=max_new_tokens, minimum=0)
        tokens = prompt
        if not use_cache:
            for _ in range(max_new_tokens):
                tokens = torch.cat([tokens, self(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
            return tokens
        state = self.init_state(prompt.shape[0])
        for t in range(prompt.shape[1]):
            logits, state = self.step(prompt[:, t], state)
        for i in range(max_new_tokens):
            nxt = logits.argmax(-1)
            tokens = torch.cat([tokens, nxt.unsqueeze(1)], dim=1)
            if i + 1 < max_new_tokens:
                logits, state = self.step(nxt, state)
        return tokens

    def aux_loss(self) -> torch.Tensor:
        """Sum of the Switch load-balancing losses of the MoE layers in the last forward pass."""
        losses = [layer.ffn.aux_loss for layer in self.layers if isinstance(getattr(layer, "ffn", None), MoEFeedForward)]
        return torch.stack(losses).sum() if losses else torch.zeros(())

    def state_size(self, seq_len: int) -> int:
        """Numbers one sequence keeps between tokens at inference after ``seq_len`` tokens, all layers:
        K and V of every past token for attention (of the last w for local attention: token t + 1
        reads them and its own), the fixed state otherwise."""
        _checks.ints("HybridLM.state_size", minimum=0, seq_len=seq_len)
        c, total = self.config, 0
        for layer in self.layers:
            kind = layer.spec.mixer
            if kind in ("attention", "local_attention"):
                attn = layer.mixer.attn
                kept = seq_len if layer.mixer.window is None else min(seq_len, layer.mixer.window)   # the next token adds its own
                total += 2 * attn.n_kv_heads * attn.head_dim * kept
            elif kind == "shared_attention":
                total += 2 * 2 * c.d_model * seq_len
            elif kind == "mamba":
                mc = layer.mixer.config
                total += mamba_state_size(mc.d_inner, mc.d_state, mc.d_conv)
            else:
                total += layer.mixer.state_size()
        return total


def decode_state_numbers(state: dict) -> list[int]:
    """How many numbers each pattern entry holds in a decoding state (:meth:`HybridLM.init_state` /
    :meth:`HybridLM.step`): the K/V entries of an attention cache, the fixed state of the others.

    After N tokens their sum is ``HybridLM.state_size(N)``; times each tensor's element size it is
    the memory decoding needs besides the weights.
    """
    if not (isinstance(state, dict) and "layers" in state):
        raise TypeError(f"decode_state_numbers: state must be a HybridLM decoding state (a dict with 'layers'), "
                        f"got {type(state).__name__}")

    def count(obj) -> int:
        if isinstance(obj, torch.Tensor):
            return obj.numel()
        return sum(count(o) for o in obj)

    return [count(layer_state) for layer_state in state["layers"]]


def decode_state_bytes(state: dict) -> list[int]:
    """Bytes each pattern entry holds in a decoding state (numbers × their element size)."""
    if not (isinstance(state, dict) and "layers" in state):
        raise TypeError(f"decode_state_bytes: state must be a HybridLM decoding state (a dict with 'layers'), "
                        f"got {type(state).__name__}")

    def size(obj) -> int:
        if isinstance(obj, torch.Tensor):
            return obj.numel() * obj.element_size()
        return sum(size(o) for o in obj)

    return [size(layer_state) for layer_state in state["layers"]]


# ---------------------------------------------------------------------------------------------
# Calculators for published, full-size configurations
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelConfig:
    """A published configuration, enough to count parameters: layer l is attention when
    ``l % attn_period == attn_offset`` (Mamba otherwise) and has a mixture-of-experts FFN when
    ``n_experts > 1`` and ``l % expert_period == expert_offset`` (a dense FFN otherwise).

    glu: the FFN is gated (SwiGLU: three d × d_ff matrices) rather than two matrices;
    mamba_inner_norms: Jamba's RMSNorms on Δ, B and C inside its Mamba layers.
    """

    name: str
    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    attn_period: int = 1
    attn_offset: int = 0
    n_experts: int = 1
    top_k: int = 1
    expert_period: int = 1
    expert_offset: int = 0
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    dt_rank: int | None = None
    glu: bool = True
    ffn_bias: bool = False
    tie_embeddings: bool = False
    mamba_inner_norms: bool = False
    source: str = ""

    def pattern(self) -> list[LayerSpec]:
        return [LayerSpec("attention" if l % self.attn_period == self.attn_offset else "mamba",
                          "moe" if self.n_experts > 1 and l % self.expert_period == self.expert_offset else "mlp")
                for l in range(self.n_layers)]


JAMBA_V01 = ModelConfig("Jamba-v0.1", vocab=65536, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336,
                        attn_period=8, attn_offset=4, n_experts=16, top_k=2, expert_period=2, expert_offset=1,
                        d_state=16, d_conv=4, expand=2, dt_rank=256, mamba_inner_norms=True,
                        source="Lieber et al. 2024 and the released config of ai21labs/Jamba-v0.1")
MIXTRAL_8X7B = ModelConfig("Mixtral-8x7B", vocab=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                           d_ff=14336, n_experts=8, top_k=2, source="Jiang et al. 2024, table 1")
LLAMA2_7B = ModelConfig("Llama-2-7B", vocab=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                        d_ff=11008, source="Touvron et al. 2023, released config")
PUBLISHED = {c.name: c for c in (JAMBA_V01, MIXTRAL_8X7B, LLAMA2_7B)}


def mamba_parameters(d_model: int, d_state: int = 16, d_conv: int = 4, expand: int = 2, dt_rank: int | None = None,
                     inner_norms: bool = False) -> int:
    r"""Parameters of one Mamba mixer (as ``attnlab.ssm.Mamba``), :math:`E = ` expand, R = dt_rank:

    .. math:: \underbrace{2Ed^2}_{\text{in\_proj}} + \underbrace{Ed(d_\text{conv}+1)}_{\text{conv}}
              + \underbrace{Ed(R + 2n)}_{\text{x\_proj}} + \underbrace{(R+1)Ed}_{\text{dt\_proj}}
              + \underbrace{Ed\,n + Ed}_{A_\text{log},\,D} + \underbrace{Ed^2}_{\text{out\_proj}}

    — about :math:`3Ed^2 = 6d^2`, not "3d² (A, B, C)". ``inner_norms`` adds Jamba's R + 2n.
    """
    _checks.at_least("mamba_parameters", 1, d_model=d_model, d_state=d_state, d_conv=d_conv, expand=expand)
    d_inner, rank = expand * d_model, dt_rank or -(-d_model // 16)
    return (2 * d_inner * d_model + d_inner * (d_conv + 1) + d_inner * (rank + 2 * d_state) + (rank + 1) * d_inner
            + d_inner * d_state + d_inner + d_inner * d_model + ((rank + 2 * d_state) if inner_norms else 0))


def attention_parameters(d_model: int, n_heads: int, n_kv_heads: int) -> int:
    r"""Parameters of one attention mixer without biases: :math:`2d^2 + 2 d\, h_{kv} d_h` (W^Q, W^O, W^K, W^V)."""
    _checks.at_least("attention_parameters", 1, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads)
    head_dim = d_model // n_heads
    return 2 * d_model * d_model + 2 * d_model * n_kv_heads * head_dim


def ffn_parameters(d_model: int, d_ff: int, *, glu: bool = True, bias: bool = False) -> int:
    r"""One feed-forward network: :math:`3 d\, d_{ff}` gated (SwiGLU), :math:`2 d\, d_{ff}` (+ d_ff + d biases) otherwise."""
    _checks.at_least("ffn_parameters", 0, d_model=d_model, d_ff=d_ff)
    return (3 if glu else 2) * d_model * d_ff + ((d_ff + d_model) if bias else 0)


def parameter_count(config: ModelConfig) -> dict[str, int]:
    r"""Total and active parameters of a configuration, by part.

    Active parameters are those one token uses: everything except the :math:`E - k` experts it
    is not routed to in each MoE layer,

    .. math:: N_\text{active} = N_\text{total} - n_\text{MoE}\,(E - k)\, N_\text{FFN}

    For Jamba-v0.1 this gives 51.6B total and 12.1B active: a fraction 0.235, not k/E = 1/8,
    because only half the layers have experts and the embeddings, Mamba and attention layers
    and the dense FFNs are always active.
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"parameter_count: config must be a ModelConfig, got {type(config).__name__}")
    c = config
    pattern = c.pattern()
    n_attn = sum(s.mixer == "attention" for s in pattern)
    n_moe = sum(s.ffn == "moe" for s in pattern)
    ffn = ffn_parameters(c.d_model, c.d_ff, glu=c.glu, bias=c.ffn_bias)
    parts = {
        "embeddings": c.vocab * c.d_model * (1 if c.tie_embeddings else 2),
        "attention": n_attn * attention_parameters(c.d_model, c.n_heads, c.n_kv_heads),
        "mamba": (c.n_layers - n_attn) * mamba_parameters(c.d_model, c.d_state, c.d_conv, c.expand, c.dt_rank,
                                                          c.mamba_inner_norms),
        "dense FFN": (c.n_layers - n_moe) * ffn,
        "experts": n_moe * c.n_experts * ffn,
        "routers": n_moe * c.d_model * c.n_experts,
        "norms": (2 * c.n_layers + 1) * c.d_model,
    }
    parts["total"] = sum(parts.values())
    parts["active"] = parts["total"] - n_moe * (c.n_experts - c.top_k) * ffn
    return parts


def ssm_state_bytes(n_layers: int, d_inner: int, d_state: int = 16, d_conv: int = 4, batch: int = 1,
                    bytes_per_element: float = 2) -> float:
    r"""Bytes of the recurrent state of ``n_layers`` Mamba layers: :math:`L\, d_\text{inner}(n + d_\text{conv} - 1)\, b\,` bytes,
    independent of the context length (``attnlab.ssm.state_size`` per layer)."""
    _checks.at_least("ssm_state_bytes", 0, n_layers=n_layers, batch=batch, bytes_per_element=bytes_per_element)
    return n_layers * mamba_state_size(d_inner, d_state, d_conv) * batch * bytes_per_element


# ---------------------------------------------------------------------------------------------
# The cost model
# ---------------------------------------------------------------------------------------------

def attention_layer_flops(n: int, d_model: int) -> dict[str, float]:
    r"""Forward FLOPs (2 per multiply-add) of one attention mixer on n tokens:
    projections :math:`8 n d^2`, scores and mixing :math:`4 n^2 d` (the full n × n product, as a dense kernel computes it)."""
    _checks.at_least("attention_layer_flops", 0, n=n, d_model=d_model)
    return {"linear": 8.0 * n * d_model**2, "quadratic": 4.0 * n * n * d_model}


def mamba_layer_flops(n: int, d_model: int, d_state: int = 16, expand: int = 2, d_conv: int = 4,
                      dt_rank: int | None = None) -> float:
    r"""Forward FLOPs of one Mamba mixer on n tokens, :math:`E` = expand, :math:`R` = dt_rank:

    .. math:: n\big[\,2 d (2Ed) + 2Ed\,d_\text{conv} + 2Ed(R + 2N_s) + 2R\,Ed + 9\,Ed\,N_s + 2Ed\,d\,\big]

    (in_proj, conv, x_proj, dt_proj, the scan — about 9 operations per state and token for
    exp, the two products of the update, and :math:`C_t^\top h_t` — and out_proj). Linear in n.
    """
    _checks.at_least("mamba_layer_flops", 0, n=n, d_model=d_model, d_state=d_state, expand=expand, d_conv=d_conv)
    d_inner, rank = expand * d_model, dt_rank or -(-d_model // 16)
    return float(n * (4 * d_model * d_inner + 2 * d_inner * d_conv + 2 * d_inner * (rank + 2 * d_state)
                      + 2 * rank * d_inner + 9 * d_inner * d_state + 2 * d_inner * d_model))


def forward_flops(n: int, d_model: int, n_layers: int, attn_fraction: float, d_ff: int | None = None,
                  d_state: int = 16, expand: int = 2) -> dict[str, float]:
    r"""Forward FLOPs of a stack of ``n_layers`` layers, a fraction r of them attention, the rest Mamba, each with an FFN.

    .. math:: F(n) = rL\,(8nd^2 + 4n^2 d) + (1 - r)L\,F_\text{Mamba}(n) + L \cdot 4 n d\, d_{ff}

    For r > 0 the quadratic term wins once n passes :math:`n^* = F_\text{lin}/(4 r L d)`: a hybrid
    is still :math:`O(n^2)`, with a constant r times smaller, not "O(n) on average".
    """
    if not 0 <= attn_fraction <= 1:
        raise ValueError(f"attn_fraction must lie in [0, 1], got {attn_fraction}")
    d_ff = d_ff or 4 * d_model
    n_attn = round(attn_fraction * n_layers)
    attn = attention_layer_flops(n, d_model)
    parts = {
        "attention (quadratic)": n_attn * attn["quadratic"],
        "attention (projections)": n_attn * attn["linear"],
        "mamba": (n_layers - n_attn) * mamba_layer_flops(n, d_model, d_state, expand),
        "ffn": n_layers * 4.0 * n * d_model * d_ff,
    }
    parts["total"] = sum(parts.values())
    return parts


def local_exponent(ns, flops) -> list[float]:
    r"""The local growth exponent :math:`\mathrm d \log F / \mathrm d \log n` between consecutive points (len(ns) − 1 values)."""
    if len(ns) != len(flops):
        raise ValueError(f"local_exponent: ns and flops must have the same length, got {len(ns)} and {len(flops)}")
    if min([*ns, *flops], default=1) <= 0:
        raise ValueError("local_exponent: ns and flops must be positive (their logarithms are taken)")
    return [math.log(f1 / f0) / math.log(n1 / n0) for n0, n1, f0, f1 in zip(ns, ns[1:], flops, flops[1:])]


# ---------------------------------------------------------------------------------------------
# The matrix view
# ---------------------------------------------------------------------------------------------

def mixing_matrix(mixer, x: torch.Tensor) -> torch.Tensor:
    r"""How much each output position depends on each input position, from the module's Jacobian.

    .. math:: M_{ij} = \Big\| \frac{\partial y_i}{\partial x_j} \Big\|_F, \qquad y = \mathrm{mixer}(x)

    For a linear mixer this is the norm of the (i, j) block of its matrix; for attention or a
    selective SSM it is the matrix of the mixer linearised at x. A causal mixer gives a
    lower-triangular M.

    Args: mixer (b, L, d) → (b, L, d'); x (L, d), one sequence. Returns M (L, L).
    """
    if x.dim() != 2:
        raise ValueError(f"x must be one sequence (L, d), got {tuple(x.shape)}")
    jac = torch.autograd.functional.jacobian(lambda z: mixer(z.unsqueeze(0)).squeeze(0), x)   # (L, d', L, d)
    return jac.pow(2).sum((1, 3)).sqrt()


def semiseparable_matrix(delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    r"""The L × L matrix of one channel of a selective SSM (Dao and Gu 2024, §3):

    .. math:: M_{ij} = C_i^\top \Big(\prod_{k=j+1}^{i} e^{\Delta_k A}\Big) \Delta_j B_j \quad (j \le i), \qquad 0 \ (j > i)

    so that :math:`y = M u` is the scan :math:`h_t = e^{\Delta_t A} h_{t-1} + \Delta_t B_t u_t`,
    :math:`y_t = C_t^\top h_t`. Every block :math:`M[i \ge k,\ j < k]` below the diagonal has rank ≤ n
    (the matrix is n-semiseparable).

    Args: delta (L,) positive; A (n,) negative; B, C (L, n). Returns M (L, L).
    """
    length = delta.shape[0]
    if B.shape != (length, A.shape[0]) or C.shape != B.shape:
        raise ValueError(f"B and C must be (L, n) = ({length}, {A.shape[0]}), got {tuple(B.shape)}, {tuple(C.shape)}")
    cum = torch.cumsum(delta.unsqueeze(-1) * A, dim=0)                         # (L, n): Σ_{k ≤ i} Δ_k A
    decay = (cum.unsqueeze(1) - cum.unsqueeze(0))                               # (i, j, n): Σ_{j < k ≤ i}
    lower = torch.tril(torch.ones(length, length, dtype=torch.bool, device=delta.device))
    decay = torch.where(lower.unsqueeze(-1), decay, torch.full_like(decay, float("-inf")))
    return torch.einsum("in,ijn,jn->ij", C, decay.exp(), delta.unsqueeze(-1) * B)


def lower_block_rank(matrix: torch.Tensor, rtol: float = 1e-6) -> int:
    r"""The largest numerical rank of the blocks :math:`M[k:, :k]` strictly below the diagonal, k = 1 … L − 1.

    n-semiseparable matrices (selective SSMs with state n, masked linear attention with key
    dimension n) give at most n; causal softmax attention generically gives full rank.
    """
    if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"lower_block_rank: matrix must be square (L, L), got {tuple(matrix.shape)}")
    length = matrix.shape[0]
    ranks = [int(torch.linalg.matrix_rank(matrix[k:, :k].double(), rtol=rtol)) for k in range(1, length)]
    return max(ranks)

