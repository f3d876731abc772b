"""Plotly figure builders for the book.

Every figure that has a slider in a live kernel (see :mod:`attnlab.widgets`) also has a
kernel-free slider here: the slider's steps carry precomputed data, so the figure stays
interactive in the static book with no Python behind it. Builders take plain tensors or
arrays and return a ``plotly.graph_objects.Figure``; they compute nothing about attention.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

HEATMAP_SCALE = "Viridis"
# Okabe & Ito's colour-blind-safe set (blue, vermillion, bluish green, reddish purple, orange,
# sky blue, black), also plotly's default colour cycle once this module is imported.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
pio.templates["attnlab"] = go.layout.Template(layout=dict(colorway=PALETTE))
pio.templates.default = "plotly+attnlab"
DTYPE_BYTES = {"fp32": 4, "bf16 / fp16": 2, "fp8": 1}


def _np(x) -> np.ndarray:
    return x.detach().cpu().double().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=float)


def _axis_labels(labels):
    """Tokens as axis labels; plotly merges equal category names, so repeats get their position."""
    if labels is None:
        return None
    labels = [str(t) for t in labels]
    return labels if len(set(labels)) == len(labels) else [f"{t} ({i})" for i, t in enumerate(labels)]


def _slider(labels: Sequence[str], steps_args: Sequence[list], prefix: str, active: int = 0) -> dict:
    """A plotly slider whose i-th step applies ``steps_args[i]`` with the "update" method."""
    return dict(
        active=active, currentvalue=dict(prefix=prefix), pad=dict(t=50),
        steps=[dict(method="update", label=lab, args=args) for lab, args in zip(labels, steps_args)],
    )


def heatmap_slider(
    matrices, labels: Sequence[str], titles: Sequence[str], *, prefix: str = "",
    x_labels=None, y_labels=None, x_title: str = "key j", y_title: str = "query i",
    zmin: float | None = 0.0, zmax: float | None = None, active: int = 0,
    colorscale: str = HEATMAP_SCALE, height: int = 480,
) -> go.Figure:
    """One heatmap whose data and title a kernel-free slider switches between ``matrices``.

    matrices: (s, n, m), one matrix per slider step; labels and titles: one per step.
    """
    mats = _np(matrices)
    zmax = float(mats.max()) if zmax is None else zmax
    x, y = _axis_labels(x_labels), _axis_labels(y_labels)
    fig = go.Figure(go.Heatmap(
        z=mats[active], x=x, y=y, zmin=zmin, zmax=zmax, colorscale=colorscale,
        hovertemplate="query %{y}<br>key %{x}<br>value %{z:.3f}<extra></extra>",
    ))
    steps = [[{"z": [mat]}, {"title.text": t}] for mat, t in zip(mats, titles)]
    fig.update_layout(
        title=dict(text=titles[active]), height=height,
        xaxis=dict(title=dict(text=x_title), side="bottom"),
        yaxis=dict(title=dict(text=y_title), autorange="reversed"),
    )
    if len(mats) > 1:
        fig.update_layout(sliders=[_slider(labels, steps, prefix, active)])
    return fig


def attention_heatmap(weights, tokens_q=None, tokens_k=None, *, entropy=None, names=None) -> go.Figure:
    """Attention weights with a kernel-free slider over heads (and layers).

    weights: (h, n, m) or (layers, h, n, m); entropy: optional mean entropy per map (same
    leading shape) shown in the title; names: optional label per map.
    """
    w = _np(weights)
    if w.ndim not in (3, 4):
        raise ValueError(f"weights must be (h, n, m) or (layers, h, n, m), got shape {w.shape}")
    lead = w.shape[:-2]
    maps = w.reshape(-1, *w.shape[-2:])
    if names is None:
        names = [f"layer {i // lead[-1]} · head {i % lead[-1]}" if len(lead) == 2 else f"head {i}"
                 for i in range(len(maps))]
    ent = None if entropy is None else _np(entropy).reshape(-1)
    titles = [f"Attention weights, {nm}" + ("" if ent is None else f" (mean entropy {ent[i]:.2f} nats)")
              for i, nm in enumerate(names)]
    return heatmap_slider(maps, names, titles, prefix="", x_labels=tokens_k, y_labels=tokens_q, zmax=1.0)


def line_chart(
    x, series: Mapping[str, object], *, x_title: str, y_title: str, title: str = "",
    log_x: bool = False, log_y: bool = False, mode: str = "lines+markers", dashed: Sequence[str] = (),
    points: Sequence[str] = (), height: int = 420, hover: Mapping[str, Sequence[str]] | None = None,
) -> go.Figure:
    """Lines sharing one x axis. ``series`` maps a legend name to y values, or to (x, y).

    Names in ``dashed`` are drawn dashed; names in ``points`` as markers only (data points);
    ``hover`` optionally gives a series one label per point, shown on hover.
    """
    fig = go.Figure()
    hover = hover or {}
    for name, ys in series.items():
        xs, ys = (ys if isinstance(ys, tuple) else (x, ys))
        fig.add_trace(go.Scatter(
            x=_np(xs), y=_np(ys), name=name, mode="markers" if name in points else mode,
            line=dict(dash="dash" if name in dashed else "solid"),
            text=list(hover[name]) if name in hover else None,
            hovertemplate=f"{name}<br>%{{text}}<br>x %{{x:.4g}}, y %{{y:.4g}}<extra></extra>" if name in hover else None,
        ))
    fig.update_layout(
        title=dict(text=title), height=height,
        xaxis=dict(title=dict(text=x_title), type="log" if log_x else "linear"),
        yaxis=dict(title=dict(text=y_title), type="log" if log_y else "linear"),
    )
    return fig


def bar_chart(labels: Sequence[str], values, *, y_title: str, title: str = "", log_y: bool = False,
              height: int = 380) -> go.Figure:
    """One bar per label, with its value written on the bar."""
    vals = _np(values)
    fig = go.Figure(go.Bar(x=list(labels), y=vals, text=[f"{v:.2g}" for v in vals], textposition="outside"))
    fig.update_layout(title=dict(text=title), height=height,
                      yaxis=dict(title=dict(text=y_title), type="log" if log_y else "linear"))
    return fig


def line_slider(
    steps: Sequence[Mapping[str, tuple]], labels: Sequence[str], titles: Sequence[str], *, x_title: str,
    y_title: str, prefix: str = "", log_x: bool = False, log_y: bool = False, points: Sequence[str] = (),
    active: int = 0, height: int = 460, colors: Mapping[str, str] | None = None, dashed: Sequence[str] = (),
) -> go.Figure:
    """Lines whose data a kernel-free slider switches: one {name: (x, y)} mapping per step.

    Every step must name the same series; names in ``points`` are drawn as markers, names in
    ``dashed`` as dashed lines;
    ``colors`` optionally fixes a series' colour (to pair a marker with its line, say).
    """
    names = list(steps[0])
    colors = colors or {}
    fig = go.Figure()
    for name in names:
        x, y = steps[active][name]
        fig.add_trace(go.Scatter(x=_np(x), y=_np(y), name=name, mode="markers" if name in points else "lines",
                                 line=dict(color=colors.get(name), dash="dash" if name in dashed else "solid"),
                                 marker=dict(
                                     size=11 if name in points else 6, symbol="x" if name in points else "circle",
                                     color=colors.get(name))))
    slider_steps = [[{"x": [_np(step[nm][0]) for nm in names], "y": [_np(step[nm][1]) for nm in names]},
                     {"title.text": t}, list(range(len(names)))] for step, t in zip(steps, titles)]
    fig.update_layout(
        title=dict(text=titles[active]), height=height,
        xaxis=dict(title=dict(text=x_title), type="log" if log_x else "linear"),
        yaxis=dict(title=dict(text=y_title), type="log" if log_y else "linear"),
        sliders=[_slider(labels, slider_steps, prefix, active)],
    )
    return fig


def spread_slider(
    steps: Sequence[Mapping[str, tuple]], labels: Sequence[str], titles: Sequence[str], *, x_title: str,
    y_title: str, prefix: str = "", log_x: bool = False, references: Sequence[str] = (), active: int = 0,
    height: int = 480, y_range: tuple[float, float] | None = None,
) -> go.Figure:
    """Means with their spread, whose data a kernel-free slider switches between ``steps``.

    Each step maps a series name to ``(x, mean, low, high)`` (a point's ``low``..``high`` drawn as
    an error bar around its mean, e.g. the min and max over seeds) or, for the names in
    ``references``, to ``(x, y)``: a grey dashed line with no spread. Every step names the same
    series.
    """
    names = list(steps[0])
    greys = ["#888888", "#aaaaaa", "#666666", "#bbbbbb"]

    def trace_data(name, values):
        if name in references:
            x, y = values
            return {"x": _np(x), "y": _np(y), "error_y": dict(visible=False)}
        x, mean, low, high = (_np(v) for v in values)
        return {"x": x, "y": mean, "error_y": dict(type="data", symmetric=False, array=high - mean,
                                                   arrayminus=mean - low, visible=True, thickness=1.5, width=5)}

    fig = go.Figure()
    for name in names:
        d = trace_data(name, steps[active][name])
        ref = name in references
        fig.add_trace(go.Scatter(x=d["x"], y=d["y"], error_y=d["error_y"], name=name,
                                 mode="lines" if ref else "lines+markers",
                                 line=dict(dash="dash", color=greys[references.index(name) % 4]) if ref else {}))
    slider_steps = []
    for step, t in zip(steps, titles):
        data = [trace_data(nm, step[nm]) for nm in names]
        slider_steps.append([{k: [d[k] for d in data] for k in ("x", "y", "error_y")}, {"title.text": t},
                             list(range(len(names)))])
    fig.update_layout(
        title=dict(text=titles[active]), height=height,
        xaxis=dict(title=dict(text=x_title), type="log" if log_x else "linear"),
        yaxis=dict(title=dict(text=y_title), range=list(y_range) if y_range else None),
    )
    if len(steps) > 1:
        fig.update_layout(sliders=[_slider(labels, slider_steps, prefix, active)])
    return fig


def saturation_explorer(
    x, metrics: Mapping[str, object], example_rows, *, x_title: str, x_symbol: str,
    log_x: bool = True, dashed: Sequence[str] = (), title: str = "",
) -> go.Figure:
    """Curves of softmax statistics against x, and the softmax row at the slider's x.

    x: (s,) values of the swept quantity (temperature, d_k, ...).
    metrics: legend name -> (s,) values, drawn against x on the left.
    example_rows: (s, m), one attention row per x, drawn as bars on the right.
    The kernel-free slider moves a marker along x and redraws the row.
    """
    xs, rows = _np(x), _np(example_rows)
    if rows.shape[0] != len(xs):
        raise ValueError(f"example_rows must have one row per x value: got {rows.shape[0]} rows, {len(xs)} x values")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.58, 0.42],
                        subplot_titles=("statistics of the softmax row", "one attention row"))
    solid = [name for name in metrics if name not in dashed]
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(solid)}
    colors.update({name: PALETTE[i % len(PALETTE)] for i, name in enumerate(n for n in metrics if n in dashed)})
    for name, ys in metrics.items():
        fig.add_trace(go.Scatter(x=xs, y=_np(ys), name=name, mode="lines+markers",
                                 line=dict(dash="dash" if name in dashed else "solid", color=colors[name])),
                      row=1, col=1)
    bar_index = len(metrics)
    fig.add_trace(go.Bar(x=np.arange(rows.shape[1]), y=rows[0], name="weights a_j", marker_color="#444",
                         showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text=x_title, type="log" if log_x else "linear", row=1, col=1)
    fig.update_xaxes(title_text="key j", row=1, col=2)
    fig.update_yaxes(range=[0, 1.02], title_text="a_j", row=1, col=2)
    marker = dict(type="line", xref="x", yref="paper", x0=xs[0], x1=xs[0], y0=0, y1=1,
                  line=dict(color="crimson", width=2, dash="dot"))
    step_title = [f"{title}{x_symbol} = {v:g}" for v in xs]
    steps = [[{"y": [rows[i]]}, {"shapes[0].x0": xs[i], "shapes[0].x1": xs[i], "title.text": step_title[i]}, [bar_index]]
             for i in range(len(xs))]
    fig.update_layout(shapes=[marker], title=dict(text=step_title[0]), height=600, margin=dict(b=170),
                      sliders=[_slider([f"{v:g}" for v in xs], steps, f"{x_symbol} = ")],
                      legend=dict(orientation="h", y=-0.55, yanchor="top"))
    return fig


def heatmap_and_curve(
    matrices, curve_x, curves, labels: Sequence[str], titles: Sequence[str], *, prefix: str = "",
    heat_title: str = "", curve_title: str = "", heat_axes=("column", "row"), curve_axes=("x", "y"),
    active: int = 0, colorscale: str = "RdBu", zmid: float | None = 0.0,
) -> go.Figure:
    """A heatmap and a curve side by side; a kernel-free slider switches both together.

    matrices: one 2-d array per step (shapes may differ); curves: one 1-d array per step,
    drawn against ``curve_x``; labels and titles: one per step.
    """
    mats = [_np(m) for m in matrices]
    ys = [_np(c) for c in curves]
    fig = make_subplots(rows=1, cols=2, subplot_titles=(heat_title, curve_title), horizontal_spacing=0.22)
    fig.add_trace(go.Heatmap(z=mats[active], colorscale=colorscale, zmid=zmid,
                             colorbar=dict(x=0.41, len=0.9, thickness=12)), row=1, col=1)
    fig.add_trace(go.Scatter(x=_np(curve_x), y=ys[active], mode="lines", showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text=heat_axes[0], row=1, col=1)
    fig.update_yaxes(title_text=heat_axes[1], autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text=curve_axes[0], row=1, col=2)
    fig.update_yaxes(title_text=curve_axes[1], row=1, col=2)
    steps = [[{"z": [m, None], "y": [None, y]}, {"title.text": t}, [0, 1]] for m, y, t in zip(mats, ys, titles)]
    fig.update_layout(title=dict(text=titles[active]), height=500,
                      sliders=[_slider(labels, steps, prefix, active)])
    return fig


def tile_replay(
    weight_steps, tiles: Sequence[tuple[int, int, int, int]], state_steps: Mapping[str, Sequence],
    finals: Mapping[str, object], titles: Sequence[str],
) -> go.Figure:
    """Replay a tiled computation: a kernel-free slider walks through the tiles.

    weight_steps: (s, n, m), the attention weights of the tiles processed so far (NaN elsewhere);
    tiles: (q0, q1, k0, k1) of the tile processed at each step, outlined on the left;
    state_steps: name -> s arrays of shape (n,), running per-row state drawn on the right;
    finals: name -> (n,), final values drawn dashed for comparison.
    """
    ws = _np(weight_steps)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("weights of the tiles processed so far", "running state per query row"),
                        horizontal_spacing=0.14)
    fig.add_trace(go.Heatmap(z=ws[0], zmin=0, zmax=float(np.nanmax(ws[-1])), colorscale=HEATMAP_SCALE,
                             colorbar=dict(x=0.43, len=0.9, thickness=12)), row=1, col=1)
    names = list(state_steps)
    for i, name in enumerate(names):
        fig.add_trace(go.Scatter(y=_np(state_steps[name][0]), name=name, mode="lines+markers",
                                 line=dict(color=PALETTE[i % len(PALETTE)])), row=1, col=2)
    for i, (name, values) in enumerate(finals.items()):
        fig.add_trace(go.Scatter(y=_np(values), name=name, mode="lines",
                                 line=dict(dash="dash", color=PALETTE[(i + len(names)) % len(PALETTE)])), row=1, col=2)
    fig.update_yaxes(autorange="reversed", title_text="query i", row=1, col=1)
    fig.update_xaxes(title_text="key j", row=1, col=1)
    fig.update_xaxes(title_text="query row i", row=1, col=2)

    def outline(tile):
        q0, q1, k0, k1 = tile
        return {"shapes[0].x0": k0 - 0.5, "shapes[0].x1": k1 - 0.5, "shapes[0].y0": q0 - 0.5, "shapes[0].y1": q1 - 0.5}

    steps = [[{"z": [ws[t]] + [None] * len(names), "y": [None] + [_np(state_steps[nm][t]) for nm in names]},
              {"title.text": titles[t], **outline(tiles[t])}, list(range(len(names) + 1))] for t in range(len(ws))]
    rect = dict(type="rect", xref="x", yref="y", line=dict(color="crimson", width=3), **{
        k.split(".")[1]: v for k, v in outline(tiles[0]).items()})
    fig.update_layout(title=dict(text=titles[0]), height=520, shapes=[rect], legend=dict(orientation="h", y=-0.45),
                      sliders=[_slider([str(t + 1) for t in range(len(ws))], steps, "tile ")], margin=dict(b=150))
    return fig


def memory_chart(
    ns, elements: Mapping[str, object], *, dtype_bytes: Mapping[str, int] = DTYPE_BYTES,
    limits: Mapping[str, float] | None = None, title: str = "Memory against sequence length",
) -> go.Figure:
    """Bytes against sequence length on log-log axes, with a kernel-free slider over the dtype.

    ns: (s,) sequence lengths; elements: legend name -> (s,) numbers of stored values;
    limits: optional horizontal lines, name -> bytes (a device's memory, say).
    """
    n = _np(ns)
    names = list(elements)
    counts = {k: _np(v) for k, v in elements.items()}
    dtypes = list(dtype_bytes)
    fig = go.Figure()
    for name in names:
        fig.add_trace(go.Scatter(x=n, y=counts[name] * dtype_bytes[dtypes[0]], name=name, mode="lines+markers"))
    shapes, annotations = [], []
    for label, value in (limits or {}).items():
        shapes.append(dict(type="line", xref="paper", x0=0, x1=1, y0=value, y1=value, line=dict(dash="dot", color="gray")))
        annotations.append(dict(xref="paper", x=0.01, y=np.log10(value), text=label, showarrow=False, yanchor="bottom"))
    steps = [[{"y": [counts[nm] * dtype_bytes[dt] for nm in names]}, {"title.text": f"{title} ({dt})"}] for dt in dtypes]
    fig.update_layout(
        title=dict(text=f"{title} ({dtypes[0]})"), height=460, shapes=shapes, annotations=annotations,
        xaxis=dict(title=dict(text="sequence length n"), type="log"),
        yaxis=dict(title=dict(text="bytes"), type="log"),
        sliders=[_slider(dtypes, steps, "dtype: ")],
    )
    return fig


def mask_gallery(masks: Mapping[str, object], *, cols: int | None = None) -> go.Figure:
    """Boolean masks side by side; dark = may attend. masks: name -> (n, m)."""
    names = list(masks)
    cols = cols or len(names)
    rows = -(-len(names) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=names, horizontal_spacing=0.06, vertical_spacing=0.14)
    for i, name in enumerate(names):
        r, c = divmod(i, cols)
        fig.add_trace(go.Heatmap(z=_np(masks[name]), colorscale=[[0, "#f4f4f4"], [1, "#2c3e50"]],
                                 zmin=0, zmax=1, showscale=False,
                                 hovertemplate="query %{y}<br>key %{x}<br>may attend: %{z}<extra></extra>"),
                      row=r + 1, col=c + 1)
    fig.update_yaxes(autorange="reversed")
    fig.update_annotations(font_size=13)
    fig.update_layout(height=280 * rows + 80, title=dict(text="Masks: dark cells may attend (row = query, column = key)"))
    return fig


def lineage_graph(nodes: Sequence[Mapping], edges: Sequence[tuple[str, str]], *,
                  title: str = "Lineage of the methods in this book") -> go.Figure:
    """Methods as points on a timeline (x = year), edges as arrows; one row per method.

    nodes: dicts with "name", "year", "family" and optional "note" (shown on hover);
    edges: (parent name, child name). Each family is a band of rows, one row per method in
    order of year, with the family's name above the band, so no two labels share a row. A
    label sits beside its marker, to the right in the first half of the years and to the left
    in the second, so it stays inside the plot at phone width; the note shows on hover. An edge
    whose child is later than its parent points forward in time (a ValueError says otherwise).
    """
    by_name = {node["name"]: node for node in nodes}
    families = list(dict.fromkeys(node["family"] for node in nodes))
    pos, band_top, y = {}, {}, 0.0
    for fam in families:                                          # one row per method, a gap per band
        band_top[fam] = y
        y += 1.1
        for node in sorted((nd for nd in nodes if nd["family"] == fam), key=lambda nd: (nd["year"], nd["name"])):
            pos[node["name"]] = (node["year"], y)
            y += 1.0
        y += 0.3
    years = [nd["year"] for nd in nodes]
    middle = (min(years) + max(years)) / 2
    colors = [c for c in PALETTE if c != "#000000"] + ["#888888", "#bcbd22", "#e377c2"]   # no black: dark mode
    fig = go.Figure()
    annotations = []
    for parent, child in edges:
        if parent not in by_name or child not in by_name:
            raise ValueError(f"edge ({parent!r}, {child!r}) names a node that is not in nodes")
        if by_name[child]["year"] < by_name[parent]["year"]:
            raise ValueError(f"edge ({parent!r}, {child!r}) points back in time")
        (x0, y0), (x1, y1) = pos[parent], pos[child]
        annotations.append(dict(x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y", text="",
                                showarrow=True, arrowhead=2, arrowsize=1, arrowwidth=1, arrowcolor="#9a9a9a",
                                opacity=0.6, standoff=5, startstandoff=5))
    for i, fam in enumerate(families):
        members = [nd for nd in nodes if nd["family"] == fam]
        color = colors[i % len(colors)]
        fig.add_trace(go.Scatter(
            x=[pos[nd["name"]][0] for nd in members], y=[pos[nd["name"]][1] for nd in members],
            mode="markers+text", name=fam, text=[nd["name"] for nd in members],
            textposition=["middle right" if nd["year"] <= middle else "middle left" for nd in members],
            marker=dict(size=9, color=color), textfont=dict(size=11), cliponaxis=False,
            customdata=[[nd["year"], nd.get("note", "")] for nd in members],
            hovertemplate="<b>%{text}</b> (%{customdata[0]})<br>%{customdata[1]}<extra></extra>",
        ))
        annotations.append(dict(x=0, xref="paper", y=band_top[fam] + 0.35, yref="y", text=f"<b>{fam}</b>",
                                showarrow=False, xanchor="left", font=dict(size=11, color=color)))
    fig.update_layout(
        title=dict(text=title, y=0.995, yanchor="top"), height=int(160 + 17 * y), annotations=annotations,
        margin=dict(l=10, r=10, t=80, b=40),            # years on top; the title above them
        xaxis=dict(dtick=2, side="top", range=[min(years) - 0.4, max(years) + 0.4]),
        yaxis=dict(visible=False, range=[y, -0.4]),
        showlegend=False,
    )
    return fig


LAYER_COLORS = {"A": "#d62728", "W": "#ff7f0e", "S": "#9467bd", "L": "#e377c2", "M": "#1f77b4", "R": "#2ca02c",
                "H": "#17becf"}
LAYER_NAMES = {"A": "attention", "W": "local attention", "S": "shared attention + MLP", "L": "linear attention",
               "M": "Mamba", "R": "RG-LRU", "H": "Hyena"}
FFN_NAMES = {"f": "MLP", "E": "mixture of experts", "·": "no FFN"}


def layer_stripes(patterns: Mapping[str, tuple[str, str]], *, title: str = "Layer patterns") -> go.Figure:
    """One stripe per architecture, one square per layer coloured by its mixer; hover names the layer.

    patterns: name -> (mixer letters, FFN letters), as ``attnlab.hybrid.pattern_string`` returns
    (A attention, W local attention, S shared attention, L linear attention, M Mamba, R RG-LRU,
    H Hyena; f MLP,
    E experts, · none). Layers with experts get a diamond underneath. Clicking a legend entry
    hides that layer type.
    """
    names = list(patterns)
    fig = go.Figure()
    for letter, color in LAYER_COLORS.items():
        xs, ys, text = [], [], []
        for row, name in enumerate(names):
            mixers, ffns = patterns[name]
            for layer, (m, f) in enumerate(zip(mixers, ffns)):
                if m == letter:
                    xs.append(layer)
                    ys.append(row)
                    text.append(f"{name}, layer {layer}: {LAYER_NAMES[m]} + {FFN_NAMES.get(f, f)}")
        if xs:
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=LAYER_NAMES[letter], text=text,
                                     hovertemplate="%{text}<extra></extra>",
                                     marker=dict(symbol="square", size=11, color=color)))
    xs, ys = [], []
    for row, name in enumerate(names):
        for layer, f in enumerate(patterns[name][1]):
            if f == "E":
                xs.append(layer)
                ys.append(row + 0.32)
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="mixture of experts FFN", hoverinfo="skip",
                                 marker=dict(symbol="diamond", size=6, color="#444")))
    counts = [f"{name} ({len(patterns[name][0])} layers)" for name in names]
    fig.update_layout(
        title=dict(text=title), height=140 + 70 * len(names), legend=dict(orientation="h", y=-0.25),
        xaxis=dict(title=dict(text="layer (input at the left)"), zeroline=False),
        yaxis=dict(tickvals=list(range(len(names))), ticktext=counts, range=[len(names) - 0.4, -0.6], showgrid=False),
    )
    return fig


def matrix_gallery(steps: Sequence[Mapping[str, object]], labels: Sequence[str] = ("",), *, cols: int | None = None,
                   title: str = "", prefix: str = "", colorscale: str = HEATMAP_SCALE) -> go.Figure:
    """Square matrices side by side, each scaled to its own maximum; a kernel-free slider switches sets.

    steps: one mapping name -> (L, L) matrix per slider step (the same names in every step);
    labels: one per step. Rows are outputs i, columns inputs j, as in a mixing matrix.
    """
    names = list(steps[0])
    cols = cols or len(names)
    rows = -(-len(names) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=names, horizontal_spacing=0.04, vertical_spacing=0.12)

    def scaled(m):
        m = _np(m)
        top = np.nanmax(np.abs(m))
        return m / top if top > 0 else m

    for i, name in enumerate(names):
        r, c = divmod(i, cols)
        fig.add_trace(go.Heatmap(z=scaled(steps[0][name]), zmin=0, zmax=1, colorscale=colorscale, showscale=i == 0,
                                 hovertemplate="output %{y}<br>input %{x}<br>scaled %{z:.3f}<extra></extra>"),
                      row=r + 1, col=c + 1)
    fig.update_yaxes(autorange="reversed")
    fig.update_annotations(font_size=12)
    fig.update_layout(height=260 * rows + 160, title=dict(text=title))
    if len(steps) > 1:
        slider_steps = [[{"z": [scaled(step[nm]) for nm in names]}, {}, list(range(len(names)))] for step in steps]
        fig.update_layout(sliders=[_slider(labels, slider_steps, prefix)])
    return fig
