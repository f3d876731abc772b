"""ipywidgets explorers for a live kernel, built on the figure builders of :mod:`attnlab.viz`.

In the static book these cells show a frozen snapshot; the kernel-free slider figures of
:mod:`attnlab.viz` are what stays interactive there.
"""
from __future__ import annotations

import ipywidgets as widgets
import torch

from . import viz
from .attention import attention_entropy, masked_softmax


def show(out: widgets.Output, fig) -> None:
    """Replace what ``out`` shows with ``fig``.

    Sets the Output widget's state directly instead of capturing a display call: nbclient
    (which executes the book) stalls until its timeout when a large figure is captured
    into an Output widget.
    """
    out.outputs = ()
    out.append_display_data(fig)


def attention_explorer(scores: torch.Tensor, tokens=None) -> widgets.Widget:
    """Sliders for the inverse temperature β and the head over raw scores (h, n, m).

    Shows softmax(β · scores) for the chosen head, with its mean entropy.
    """
    if scores.dim() != 3:
        raise ValueError(f"scores must have shape (h, n, m), got {tuple(scores.shape)}")
    beta = widgets.FloatLogSlider(value=1.0, base=10, min=-1.5, max=1.5, step=0.05, description="β")
    head = widgets.IntSlider(value=0, min=0, max=scores.shape[0] - 1, description="head")
    out = widgets.Output()

    def redraw(*_):
        weights = masked_softmax(beta.value * scores[head.value])
        entropy = attention_entropy(weights).mean()
        fig = viz.attention_heatmap(weights.unsqueeze(0), tokens, tokens, entropy=entropy.reshape(1),
                                    names=[f"head {head.value}, β = {beta.value:.2f}"])
        show(out, fig)

    beta.observe(redraw, "value")
    head.observe(redraw, "value")
    redraw()
    return widgets.VBox([widgets.HBox([beta, head]), out])


def memory_explorer(lengths=None) -> widgets.Widget:
    """Sliders for batch, heads and layers over the memory of stored attention weights.

    Plots b · h · layers · n² values against n (:func:`attnlab.viz.memory_chart`, whose own
    slider switches the dtype).
    """
    lengths = lengths or [2**p for p in range(8, 18)]
    batch = widgets.IntSlider(value=1, min=1, max=64, description="batch")
    heads = widgets.IntSlider(value=32, min=1, max=128, description="heads")
    layers = widgets.IntSlider(value=32, min=1, max=128, description="layers")
    out = widgets.Output()

    def redraw(*_):
        per_head = [n * n for n in lengths]
        total = [batch.value * heads.value * layers.value * c for c in per_head]
        fig = viz.memory_chart(lengths, {"one head, one layer": per_head,
                                         f"{batch.value} × {heads.value} heads × {layers.value} layers": total},
                               limits={"24 GiB": 24 * 2**30, "80 GB": 80e9})
        show(out, fig)

    for w in (batch, heads, layers):
        w.observe(redraw, "value")
    redraw()
    return widgets.VBox([widgets.HBox([batch, heads, layers]), out])


def positional_explorer(n: int = 128) -> widgets.Widget:
    """Sliders for the width d and the base of the sinusoidal encoding.

    Shows the (n, d) table and the similarity PE_0 · PE_k / (d/2) against the offset k.
    """
    from .positional import sinusoidal_encoding

    width = widgets.IntSlider(value=64, min=4, max=512, step=4, description="d")
    base = widgets.FloatLogSlider(value=10000, base=10, min=1, max=5, step=0.25, description="base")
    out = widgets.Output()

    def redraw(*_):
        pe = sinusoidal_encoding(n, width.value, base.value, dtype=torch.float64)
        title = f"d = {width.value}, base = {base.value:.0f}"
        fig = viz.heatmap_and_curve([pe], list(range(n)), [pe @ pe[0] / (width.value / 2)], [title], [title],
                                    heat_title="PE table", curve_title="PE_0 · PE_k / (d/2)",
                                    heat_axes=("dimension", "position"), curve_axes=("offset k", "similarity"))
        show(out, fig)

    width.observe(redraw, "value")
    base.observe(redraw, "value")
    redraw()
    return widgets.VBox([widgets.HBox([width, base]), out])


def kv_cache_explorer() -> widgets.Widget:
    """Sliders for context length, batch and dtype over the KV-cache size of every preset and variant.

    Bars: :data:`attnlab.kv_cache.PRESETS` (published models) and :func:`attnlab.kv_cache.variants`
    (one Llama-2-7B-shaped model with each kind of cache), in GiB.
    """
    from .kv_cache import PRESETS, variants

    specs = {**PRESETS, **variants()}
    context = widgets.IntSlider(value=15, min=10, max=20, description="log₂ tokens")
    batch = widgets.IntSlider(value=1, min=1, max=64, description="batch")
    dtype = widgets.Dropdown(options=list(viz.DTYPE_BYTES), value="bf16 / fp16", description="dtype")
    out = widgets.Output()

    def redraw(*_):
        n = 2**context.value
        sizes = [spec.bytes(n, batch.value, viz.DTYPE_BYTES[dtype.value]) / 2**30 for spec in specs.values()]
        show(out, viz.bar_chart(list(specs), sizes, y_title="GiB", log_y=True,
                                title=f"KV cache at {n:,} tokens, batch {batch.value}, {dtype.value}"))

    for w in (context, batch, dtype):
        w.observe(redraw, "value")
    redraw()
    return widgets.VBox([widgets.HBox([context, batch, dtype]), out])
