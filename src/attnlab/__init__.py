"""Attention Lab: a small, tested PyTorch library for learning attention and its successors.

Every chapter of the book imports this package, so the code a reader studies is the
code the tests check. One module per idea:

    attnlab.attention    scaled dot-product attention, masks, multi-head attention, entropy
    attnlab.positional   positional encodings (sinusoidal; chapter 02 adds RoPE, ALiBi, learned)
    attnlab.numerics     the numerical-agreement rule every alternative form is tested by
    attnlab.viz          plotly figure builders with kernel-free sliders for the static book
    attnlab.widgets      ipywidgets explorers on the same builders, for live kernels
    attnlab.quiz         chapter quiz banks (package data) shown with jupyterquiz
    attnlab.source       show_source(obj): a library object's source, highlighted and collapsed
    attnlab.diagrams     concept diagrams as inline SVG that follow the page's light or dark mode
    attnlab.bench        timing and peak-memory helpers for notebooks and benchmarks/
    attnlab.tradeoff     the speed/memory/accuracy benchmark of attention forms (chapter 09)
    attnlab.experiments  training sweeps run from the command line, results in attnlab/data/
                         (``python -m attnlab.experiments.mqar``: the recall lab, chapter 13)
    Also: blocks, schedules, scaling, icl, tasks, train, models, kv_cache, objectives, grokking,
    diff_attention, flash, sparse, linear, ssm, s4d, ssd, hybrid, moe, rglru, hyena, mla, ring, speculative,
    nsa, quant, mod, recall (one module per idea; see the design notes).

Shape letters (the same glossary is on the book's notation page):

    b      batch
    h      query heads
    h_kv   key/value heads (h_kv divides h; h_kv < h is grouped-query attention)
    n      query length
    m      key length
    d      head dimension (d_k for queries and keys, d_v for values when they differ)
    d_model  model width, d_model = h * d
    For state space models (chapters 10-11): L length, d channels, n state size.

Attention tensors are (b, h, n, d), like torch.nn.functional.scaled_dot_product_attention.
A boolean mask means True = may attend. Causal masks are aligned bottom-right when n != m.
"""

__version__ = "0.1.0"

from attnlab.source import show_source  # noqa: E402  (the teaching pattern's "library's version")
