"""Concept diagrams as inline SVG: what flows where, a block's wiring, a layer's parameters.

Each public function returns a :class:`Diagram`; the last expression of a cell displays it.
The picture is an inline ``<svg>`` (not an ``<img>``), so it shows the same in JupyterLab,
Colab and the book and follows the page's light or dark mode: lines and text are drawn in
``currentColor`` (the page's text colour), boxes are the Okabe–Ito colour-blind-safe palette
at low opacity with a solid outline. Every SVG has a ``<title>`` and ``<desc>`` for screen
readers, and its ids are derived from the diagram's name and arguments, so several diagrams
can share a page and the output is byte-identical on every run.

Parametric diagrams compute their numbers with the library: ``qkv_lookup`` runs softmax on
its scores, ``rope_rotation`` takes its angles from :func:`attnlab.positional.frequencies`,
``alibi_bias_grid`` its slopes from :func:`attnlab.positional.alibi_slopes`.
"""
from __future__ import annotations

import hashlib
import html
import math
import re
from contextlib import contextmanager

import torch

from . import positional

# Okabe & Ito (2008), a palette that colour-blind readers can tell apart.
BLUE, ORANGE, GREEN, PURPLE = "#0072B2", "#E69F00", "#009E73", "#CC79A7"
VERMILLION, SKY, YELLOW = "#D55E00", "#56B4E9", "#F0E442"
PALETTE = [BLUE, ORANGE, GREEN, PURPLE, VERMILLION, SKY, YELLOW]
INK = "currentColor"  # the page's text colour: dark on light pages, light in dark mode
FONT = "system-ui, sans-serif"


class Diagram:
    """An SVG picture that displays itself inline in Jupyter, Colab and the book."""

    def __init__(self, name: str, title: str, desc: str, svg: str):
        self.name, self.title, self.desc, self.svg = name, title, desc, svg

    def _repr_html_(self) -> str:
        return self.svg

    def __repr__(self) -> str:
        return f"Diagram: {self.title}"


# ----------------------------------------------------------------------------- drawing toolkit

def _n(v: float) -> str:
    """A coordinate with at most one decimal, so the SVG text is the same on every machine."""
    v = round(float(v), 1)
    return str(int(v)) if v == int(v) else f"{v:.1f}"


def _minus(s: str) -> str:
    """Typographic minus signs in printed numbers."""
    return s.replace("-", "\u2212")


def _rich(s: str, size: float) -> str:
    """Escape a label and turn ``_{sub}`` into a lowered, smaller tspan (works in every browser)."""
    out, shift = [], round(size * 0.3)
    for part in re.split(r"(_\{[^}]*\})", s):
        if part.startswith("_{"):
            sub = html.escape(part[2:-1])
            out.append(f'<tspan dy="{shift}" font-size="{max(11, round(size * 0.8))}">{sub}</tspan>'
                       f'<tspan dy="-{shift}">\u200b</tspan>')
        else:
            out.append(html.escape(part))
    return "".join(out)


def _plain(s: str) -> str:
    """A label without markup, for <title> and <desc>."""
    return re.sub(r"_\{([^}]*)\}", r"_\1", s)


class Drawing:
    """A small SVG canvas: boxes, text, arrows, circles and lines in user units (= px at full width)."""

    def __init__(self, name: str, width: int, height: int, title: str, desc: str):
        self.id = f"attnlab-{name}"
        self.width, self.height, self.title, self.desc = width, height, title, desc
        self.parts: list[str] = []
        self.defs: dict[str, str] = {}

    # -- primitives
    def text(self, x, y, s, size=15, anchor="middle", weight=None, color=INK, italic=False, rotate=0):
        """Text centred (or start/end-anchored) at x, with its middle at y; ``\\n`` starts a new line."""
        lines = str(s).split("\n")
        extra = (f' font-weight="{weight}"' if weight else "") + (' font-style="italic"' if italic else "")
        extra += f' transform="rotate({rotate} {_n(x)} {_n(y)})"' if rotate else ""
        y0 = y - (len(lines) - 1) * size * 0.6
        for i, line in enumerate(lines):
            self.parts.append(f'<text x="{_n(x)}" y="{_n(y0 + i * size * 1.2)}" font-size="{size}" '
                              f'text-anchor="{anchor}" dominant-baseline="central" fill="{color}"{extra}>'
                              f'{_rich(line, size)}</text>')

    def rect(self, x, y, w, h, color=BLUE, fill_opacity=0.2, stroke=None, rx=0, width=1.5, dashed=False):
        """A filled rectangle with an outline (the fill colour unless ``stroke`` is given)."""
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        self.parts.append(f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}" rx="{rx}" '
                          f'fill="{color}" fill-opacity="{fill_opacity}" stroke="{stroke or color}" '
                          f'stroke-width="{width}"{dash}/>')

    def box(self, x, y, w, h, label="", sub="", color=BLUE, size=15, fill_opacity=0.2):
        """A rounded box with a centred label and an optional smaller sub-label under it."""
        self.rect(x, y, w, h, color, fill_opacity, rx=6)
        if label and sub:
            self.text(x + w / 2, y + h / 2 - 8, label, size)
            self.text(x + w / 2, y + h / 2 + 11, sub, 13)
        elif label:
            self.text(x + w / 2, y + h / 2, label, size)

    def line(self, *points, width=1.5, color=INK, dashed=False, marker=False):
        """A polyline through the points, optionally dashed, optionally ending in an arrowhead."""
        d = " ".join(("M" if i == 0 else "L") + f"{_n(x)},{_n(y)}" for i, (x, y) in enumerate(points))
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        end = f' marker-end="url(#{self._marker(color)})"' if marker else ""
        self.parts.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="{width}" '
                          f'stroke-linejoin="round"{dash}{end}/>')

    def arrow(self, *points, label="", label_at=None, width=1.5, color=INK, dashed=False, size=13):
        """A polyline with an arrowhead at its last point and an optional label (at ``label_at``)."""
        self.line(*points, width=width, color=color, dashed=dashed, marker=True)
        if label:
            (x0, y0), (x1, y1) = points[0], points[1]
            x, y = label_at or ((x0 + x1) / 2, (y0 + y1) / 2 - 10)
            self.text(x, y, label, size)

    def circle(self, cx, cy, r, label="", color=INK, fill_opacity=0.0, width=1.5, size=18, dashed=False):
        """A circle, optionally filled (palette colour at low opacity) and labelled at its centre."""
        dash = ' stroke-dasharray="4 4"' if dashed else ""
        fill = "none" if fill_opacity == 0 else color
        self.parts.append(f'<circle cx="{_n(cx)}" cy="{_n(cy)}" r="{_n(r)}" fill="{fill}" '
                          f'fill-opacity="{fill_opacity}" stroke="{color}" stroke-width="{width}"{dash}/>')
        if label:
            self.text(cx, cy, label, size)

    @contextmanager
    def group(self, opacity=None, cls=None):
        """Everything drawn inside the ``with`` block becomes one <g>, e.g. to fade it as a whole."""
        attrs = (f' opacity="{opacity:.2f}"' if opacity is not None else "") + (f' class="{cls}"' if cls else "")
        self.parts.append(f"<g{attrs}>")
        yield self
        self.parts.append("</g>")

    def hatch(self) -> str:
        """The id of a diagonal-hatch pattern in the page's text colour (for masked cells)."""
        pid = f"{self.id}-hatch"
        self.defs[pid] = (f'<pattern id="{pid}" width="6" height="6" patternUnits="userSpaceOnUse" '
                          f'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" '
                          f'stroke="{INK}" stroke-width="1.2" stroke-opacity="0.45"/></pattern>')
        return pid

    def _marker(self, color: str) -> str:
        """The id of an arrowhead in ``color``; markers take currentColor from the <svg>, not the line."""
        mid = f"{self.id}-arrow" + ("" if color == INK else "-" + color.lstrip("#").lower())
        self.defs[mid] = (f'<marker id="{mid}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="10" '
                          f'markerHeight="10" markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
                          f'<path d="M0,1 L10,5 L0,9 z" fill="{color}"/></marker>')
        return mid

    # -- output
    def svg(self) -> str:
        t, d = f"{self.id}-title", f"{self.id}-desc"
        defs = "".join(self.defs[k] for k in sorted(self.defs))
        return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width} {self.height}" '
                f'width="100%" style="max-width:{self.width}px;height:auto;display:block" role="img" '
                f'aria-labelledby="{t} {d}" font-family="{FONT}" class="attnlab-diagram">'
                f'<title id="{t}">{html.escape(_plain(self.title))}</title>'
                f'<desc id="{d}">{html.escape(_plain(self.desc))}</desc>'
                f"<defs>{defs}</defs>" + "\n".join(self.parts) + "</svg>")

    def diagram(self) -> Diagram:
        return Diagram(self.id, _plain(self.title), _plain(self.desc), self.svg())


def _name(fn: str, *args) -> str:
    """A deterministic id stem: the function's name and a short hash of its arguments."""
    return f"{fn}-{hashlib.sha1(repr(args).encode()).hexdigest()[:6]}"


def _sub(i: int) -> str:
    """Unicode subscript digits: 12 -> '₁₂'."""
    return str(i).translate(str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉"))


# ----------------------------------------------------------------------------- Part I diagrams

def qkv_lookup(scores=(2.0, 0.5, -1.0, 1.0)) -> Diagram:
    """Attention as a soft dictionary lookup, left to right.

    The query q is compared with every key (score sᵢ = q·kᵢ/√d, printed), softmax turns the
    scores into weights αᵢ (printed and drawn as bars), each value vᵢ is taken with its weight
    (opacity ∝ αᵢ), and Σ adds them up: o = Σ αᵢ vᵢ. Unlike a dictionary, every key matches a bit.
    """
    s = torch.tensor([float(v) for v in scores], dtype=torch.float64)
    alpha = torch.softmax(s, 0).tolist()
    k = len(alpha)
    row, top = 56, 86
    ys = [top + i * row for i in range(k)]
    mid = (ys[0] + ys[-1]) / 2
    W, H = 830, top + k * row + 40
    dr = Drawing(_name("qkv_lookup", tuple(s.tolist())), W, H,
                 "Attention as a soft dictionary lookup",
                 f"A query q is compared with {k} keys; the scores s = q·k/√d are "
                 + ", ".join(f"{v:.2f}" for v in s.tolist()) + ". Softmax turns them into weights "
                 + ", ".join(f"{a:.2f}" for a in alpha) + " that add up to 1. Each value is weighted "
                 "by its weight and the weighted values are summed into the output o = Σ αᵢ vᵢ.")
    heads = [(40, "query"), (135, "keys"), (225, "scores\nsᵢ = q·kᵢ/√d"), (330, "softmax"),
             (465, "weights αᵢ"), (595, "values"), (690, "sum"), (775, "output")]
    for x, h in heads:
        dr.text(x, 36, h, 14, weight="600")
    dr.box(15, mid - 20, 50, 40, "q", color=BLUE, size=17)
    dr.box(290, ys[0] - 18, 80, ys[-1] - ys[0] + 36, "softmax", color=PURPLE)
    bar_max = 70
    for i, (y, si, ai) in enumerate(zip(ys, s.tolist(), alpha)):
        dr.arrow((65, mid), (108, y))
        dr.box(110, y - 18, 50, 36, f"k{_sub(i + 1)}", color=ORANGE, size=16)
        dr.text(225, y, _minus(f"s{_sub(i + 1)} = {si:.2f}"), 14)
        dr.arrow((270, y), (288, y))
        dr.arrow((370, y), (390, y))
        dr.rect(395, y - 9, max(bar_max * ai, 1), 18, GREEN, 0.6, rx=2)
        dr.text(472, y, f"α{_sub(i + 1)} = {ai:.2f}", 14, anchor="start")
        with dr.group(opacity=0.15 + 0.85 * ai / max(alpha)):  # a value counts as much as its weight
            dr.rect(570, y - 18, 50, 36, SKY, 0.35, rx=6)
            dr.arrow((620, y), (668, mid + (y - mid) * 0.25), width=1 + 3 * ai)
        dr.text(595, y, f"v{_sub(i + 1)}", 16)
    dr.circle(690, mid, 20, "Σ", size=20)
    dr.arrow((710, mid), (748, mid))
    dr.box(750, mid - 20, 50, 40, "o", color=BLUE, size=17)
    dr.text(W / 2, H - 18, "o = Σᵢ αᵢ vᵢ: every value counts, in proportion to its weight "
            "(the αᵢ add up to 1)", 14)
    return dr.diagram()


def multihead_split_merge(n_heads: int = 4) -> Diagram:
    """Multi-head attention's shapes: project, split into heads, attend per head, concatenate, mix.

    x (n, d_model) goes through W_Q, W_K, W_V; each result is cut into h column slices of width
    d = d_model / h (one colour per head), reshaped to (h, n, d); head i attends with its own
    slices; the h outputs are put side by side again, (n, d_model), and W_O mixes them.
    """
    h = n_heads
    colors = [PALETTE[i % len(PALETTE)] for i in range(h)]
    hb, gap, top = 44, 12, 70
    H_stack = h * hb + (h - 1) * gap
    mid = top + max(H_stack, 240) / 2
    W, H = 920, int(top + max(H_stack, 240) + 66)
    dr = Drawing(_name("multihead_split_merge", h), W, H,
                 f"Multi-head attention with h = {h} heads: split and merge",
                 f"The input x of shape (n, d_model) is multiplied by W_Q, W_K and W_V. Each result is cut "
                 f"into {h} column slices of width d = d_model / {h}, one per head, giving shape "
                 f"(h, n, d). Each head computes softmax(Q_i K_iᵀ/√d) V_i with its own slices. The {h} "
                 "head outputs are concatenated side by side back to (n, d_model) and multiplied by W_O.")
    for x, t in [(54, "input"), (152, "project"), (244, "Q, K, V"), (320, "split"), (482, "h heads"),
                 (684, "concat"), (770, "mix"), (866, "output")]:
        dr.text(x, 32, t, 14, weight="600")
    # input and projections; each projected matrix is drawn in the colours of the heads its columns go to
    dr.box(10, mid - 45, 88, 90, "x", "(n, d_{model})", BLUE, 17)
    for j, (wname, mname) in enumerate([("W_{Q}", "Q"), ("W_{K}", "K"), ("W_{V}", "V")]):
        y = mid - 95 + j * 70
        dr.arrow((98, mid), (126, y + 25))
        dr.box(128, y, 48, 50, wname, color=PURPLE, size=16)
        dr.arrow((176, y + 25), (206, y + 25), label=mname, size=15)
        for i in range(h):
            dr.rect(208 + i * 72 / h, y, 72 / h, 50, colors[i], 0.45, stroke=INK, width=1)
    dr.text(244, mid + 132, "(n, d_{model})", 13)
    # split: one fat arrow, then one box per head
    dr.arrow((290, mid), (350, mid), label="reshape", width=2.5)
    dr.text(320, mid + 24, "(h, n, d)", 13)
    for i in range(h):
        y = top + i * (hb + gap) + (max(H_stack, 240) - H_stack) / 2
        dr.box(362, y, 240, hb, f"head {i + 1}: softmax(Q_{{{i + 1}}}K_{{{i + 1}}}ᵀ/√d)V_{{{i + 1}}}",
               color=colors[i], size=14, fill_opacity=0.22)
        dr.arrow((602, y + hb / 2), (650, mid + (i - (h - 1) / 2) * 60 / h), width=1.2)
    # concatenate: the head colours side by side again, then W_O mixes them
    for i in range(h):
        dr.rect(652 + i * 64 / h, mid - 40, 64 / h, 80, colors[i], 0.45, stroke=INK, width=1)
    dr.text(684, mid + 56, "(n, h·d)", 13)
    dr.arrow((716, mid), (744, mid))
    dr.box(746, mid - 25, 48, 50, "W_{O}", color=PURPLE, size=16)
    dr.arrow((794, mid), (822, mid))
    dr.box(824, mid - 45, 88, 90, "out", "(n, d_{model})", BLUE, 16)
    dr.text(W / 2, H - 22, f"d = d_{{model}} / h: the {h} heads only reshape Q, K and V — "
            "they add no parameters", 14)
    return dr.diagram()


def _tip_labels(ms, theta, gap=0.15):
    """Labels for the arrow tips at angles m·θ; tips closer than ``gap`` radians share one, "0–3"."""
    groups: list[list] = []
    for m in ms:
        if groups and abs(m - groups[-1][0]) * theta < gap:
            groups[-1].append(m)
        else:
            groups.append([m])
    return [(f"{g[0]}" if len(g) == 1 else f"{g[0]}–{g[-1]}", g[-1] * theta) for g in groups]


def rope_rotation(d: int = 8, positions=(0, 1, 2, 3), base: float = 10.0) -> Diagram:
    """RoPE as rotations: one circle per 2-D plane of q, the vector at position m turned by m·θᵢ.

    θᵢ = base^(−2i/d) from :func:`attnlab.positional.frequencies`; fast planes turn a lot per
    position, slow planes hardly at all. The default base is 10 so that every plane visibly
    turns; models use 10000, where the slow planes move even less.
    """
    theta = positional.frequencies(d, base).tolist()
    planes, r, pitch, row_h, per_row = len(theta), 58, 180, 230, 4
    rows = math.ceil(planes / per_row)
    W, H = max(min(planes, per_row) * pitch + 20, 700), rows * row_h + 100
    ms = list(positions)
    note = "" if base == 10000 else " for visibility (models use 10000)"
    dr = Drawing(_name("rope_rotation", d, tuple(ms), float(base)), W, H,
                 f"RoPE rotates each 2-D plane of q by m·θᵢ (d = {d}, base = {base:g})",
                 f"{planes} circles, one per pair of dimensions of a query of width d = {d}. In each, an "
                 f"arrow shows the query at positions m = {', '.join(map(str, ms))}, rotated by the angle "
                 f"m·θᵢ with θᵢ = base^(−2i/d) and base = {base:g}{note}. The frequencies are "
                 + ", ".join(f"θ{_sub(i)} = {t:.3g}" for i, t in enumerate(theta))
                 + ". A query at position m is rotated by m·θᵢ in plane i, so the dot product of q at m "
                 "and k at n depends only on m − n.")
    for i, th in enumerate(theta):
        in_row = min(per_row, planes - i // per_row * per_row)
        cx = (W - in_row * pitch) / 2 + pitch / 2 + i % per_row * pitch
        cy = 140 + i // per_row * row_h
        dr.text(cx, cy - 104, f"plane {i}: dims {2 * i}, {2 * i + 1}", 14, weight="600")
        dr.circle(cx, cy, r, dashed=True, width=1)
        with dr.group(opacity=0.4):
            dr.line((cx - r - 6, cy), (cx + r + 6, cy), width=0.8)
            dr.line((cx, cy - r - 6), (cx, cy + r + 6), width=0.8)
        for j, m in enumerate(ms):
            a = m * th
            fade = 0.45 + 0.55 * j / max(len(ms) - 1, 1)
            with dr.group(opacity=fade, cls="rope-arrow"):
                dr.arrow((cx, cy), (cx + r * math.cos(a), cy - r * math.sin(a)), width=2.2)
        for label, a in _tip_labels(ms, th):
            dr.text(cx + (r + 14 + 3 * len(label)) * math.cos(a), cy - (r + 13) * math.sin(a), label, 13)
        dr.text(cx, cy + r + 30, f"θ{_sub(i)} = {th:.3f} rad" if th >= 0.0995 else f"θ{_sub(i)} = {th:.2g} rad", 14)
    dr.text(W / 2, H - 52, "q at position m is rotated by m·θᵢ in plane i; q_{m}·k_{n} depends only on m − n",
            15, weight="600")
    dr.text(W / 2, H - 28, f"numbers at the tips: position m.   d = {d}, base = {base:g}{note}", 14)
    return dr.diagram()


def _fmt_bias(v: float) -> str:
    """A bias printed short enough for a cell: 0, −0.5, −1.25, −0.016."""
    if v == 0:
        return "0"
    s = f"{v:.3f}".rstrip("0").rstrip(".")
    return _minus(s)


def _fmt_slope(s: float) -> str:
    inv = 1 / s
    return f"1/{round(inv)}" if abs(inv - round(inv)) < 1e-9 else f"{s:.3f}"


def alibi_bias_grid(n: int = 6, n_heads: int = 4) -> Diagram:
    """ALiBi's causal bias −slope·(i − j) for every head: an n × n grid, query i down, key j across.

    Cells are shaded by the size of the penalty on one scale for all heads (numbers printed
    when n ≤ 8); hatched cells above the diagonal are masked (a token sees no future keys).
    Steep heads look only nearby, shallow heads far back: the slopes are
    :func:`attnlab.positional.alibi_slopes`.
    """
    slopes = positional.alibi_slopes(n_heads).tolist()
    cell = 54 if n <= 8 else max(4, 200 // n)
    side = cell * n
    pw, ph = side + 60, side + 74
    cols = max(1, min(n_heads, 800 // pw))
    rows = math.ceil(n_heads / cols)
    W, H = max(cols * pw + 40, 640), rows * ph + 70
    biggest = max(slopes) * (n - 1) or 1.0
    dr = Drawing(_name("alibi_bias_grid", n, n_heads), W, H,
                 f"ALiBi's causal attention bias for {n_heads} heads, n = {n}",
                 f"For each of {n_heads} heads a grid of {n} by {n} cells: row i is the query, column j the key. "
                 "Allowed cells (j ≤ i) hold the bias −slope·(i − j), shaded by its size; cells above the "
                 "diagonal are masked. The slopes are " + ", ".join(_fmt_slope(s) for s in slopes)
                 + ", so the first head penalises distance most steeply and the last barely at all.")
    hatch = dr.hatch()
    for hd, slope in enumerate(slopes):
        ox = (W - cols * pw) / 2 + (hd % cols) * pw + 30
        oy = 16 + (hd // cols) * ph + 46
        dr.text(ox + side / 2, oy - 30, f"head {hd + 1}: slope {_fmt_slope(slope)}", 14, weight="600")
        dr.text(ox + side / 2, oy - 11, "key j →", 13)
        dr.text(ox - 14, oy + side / 2, "query i →", 13, rotate=-90)
        for i in range(n):
            for j in range(n):
                x, y = ox + j * cell, oy + i * cell
                if j > i:
                    dr.parts.append(f'<rect x="{_n(x)}" y="{_n(y)}" width="{cell}" height="{cell}" '
                                    f'fill="url(#{hatch})" stroke="{INK}" stroke-opacity="0.25" '
                                    'stroke-width="0.5"/>')
                    continue
                v = -slope * (i - j)
                dr.rect(x, y, cell, cell, VERMILLION, 0.08 + 0.55 * abs(v) / biggest, stroke=INK, width=0.5)
                if n <= 8:
                    dr.text(x + cell / 2, y + cell / 2, _fmt_bias(v), 13)
    dr.text(W / 2, H - 22, "bias = −slope·(i − j) is added to the score q_{i}·k_{j}/√d; "
            "hatched: masked (j > i)", 14)
    return dr.diagram()


def _add(dr: Drawing, x, y, r=13):
    """A ⊕ node: the residual addition."""
    dr.circle(x, y, r, width=2)
    dr.line((x - r + 4, y), (x + r - 4, y), width=2)
    dr.line((x, y - r + 4), (x, y + r - 4), width=2)


def _stream(dr: Drawing, x, y_in, y_out, stops, color, width):
    """The residual stream from y_in (bottom) up to y_out, broken around the (y, half-height) stops."""
    y = y_in
    for yc, half in sorted(stops, reverse=True):
        dr.line((x, y), (x, yc + half), width=width, color=color)
        y = yc - half
    dr.line((x, y), (x, y_out + 14), width=width, color=color)
    dr.arrow((x, y_out + 16), (x, y_out), width=2, color=color)


def _branch(dr: Drawing, x, y_from, y_to, bx, boxes):
    """A branch leaving the stream at y_from, up through ``boxes`` (label, colour), back into a ⊕ at y_to."""
    dr.line((x, y_from), (bx, y_from), (bx, y_from - 14))
    y = y_from - 14
    for label, color in boxes:
        dr.arrow((bx, y), (bx, y - 16))
        dr.box(bx - 52, y - 52, 104, 36, label, color=color, size=15)
        y -= 52
    dr.arrow((bx, y), (bx, y_to), (x + 14, y_to))
    _add(dr, x, y_to)


def block_wiring() -> Diagram:
    """Pre-LN and post-LN Transformer blocks side by side, data flowing upward.

    Pre-LN normalises the input of each branch, x + Attn(LN(x)), so the residual stream is a clean
    identity path from input to output. Post-LN normalises after each addition, LN(x + Attn(x)),
    so every path from input to output passes through the LayerNorms.
    """
    W, H, pw = 760, 580, 380
    dr = Drawing("block_wiring", W, H, "Pre-LN and post-LN Transformer blocks",
                 "Two Transformer blocks, data flowing upward from x to the output. Left, pre-LN: "
                 "y = x + Attn(LN(x)), out = y + FFN(LN(y)); the LayerNorms sit inside the two branches "
                 "and the residual stream is an unbroken identity path from x to the output. Right, "
                 "post-LN: y = LN(x + Attn(x)), out = LN(y + FFN(y)); a LayerNorm follows each addition "
                 "on the main path, so every path from x to the output passes through both LayerNorms.")
    for p, (name, f1, f2) in enumerate([("Pre-LN", "y = x + Attn(LN(x))", "out = y + FFN(LN(y))"),
                                        ("Post-LN", "y = LN(x + Attn(x))", "out = LN(y + FFN(y))")]):
        ox = p * pw
        sx = ox + 150
        dr.text(ox + pw / 2, 24, name, 17, weight="700")
        dr.text(ox + pw / 2, 50, f1, 15)
        dr.text(ox + pw / 2, 72, f2, 15)
        dr.text(sx, 530, "x", 17, italic=True)
        dr.text(sx, 104, "out", 16, italic=True)
        if p == 0:  # LN inside the branches: the stream itself is untouched
            _stream(dr, sx, 515, 120, [(320, 13), (150, 13)], GREEN, 6)
            _branch(dr, sx, 480, 320, sx + 120, [("LN", PURPLE), ("Attention", BLUE)])
            _branch(dr, sx, 290, 150, sx + 120, [("LN", PURPLE), ("FFN", ORANGE)])
            dr.text(sx - 16, 400, "identity path", 14, anchor="end", color=GREEN, weight="600")
            dr.text(sx - 16, 420, "x → out", 14, anchor="end", color=GREEN)
        else:  # LN after each addition, on the stream
            _stream(dr, sx, 515, 120, [(390, 13), (350, 16), (220, 13), (180, 16)], INK, 4)
            _branch(dr, sx, 480, 390, sx + 120, [("Attention", BLUE)])
            dr.box(sx - 40, 334, 80, 32, "LN", color=PURPLE)
            _branch(dr, sx, 300, 220, sx + 120, [("FFN", ORANGE)])
            dr.box(sx - 40, 164, 80, 32, "LN", color=PURPLE)
            dr.text(sx - 16, 440, "every path", 14, anchor="end", weight="600")
            dr.text(sx - 16, 460, "passes both LNs", 14, anchor="end")
    dr.line((pw, 16), (pw, H - 56), width=1, dashed=True)
    dr.text(W / 2, H - 22, "A pre-LN stack adds one final LN after its last block (GPT-2 does).", 14)
    return dr.diagram()


def parameter_map(d_model: int = 768, d_ff: int = 3072, n_heads: int = 12) -> Diagram:
    """One block's weight matrices as rectangles, area ∝ parameter count (biases and norms left out).

    Drawn as rows × columns: W_Q, W_K, W_V, W_O are d_model × d_model squares, W_1 is
    d_model × d_ff (wide), W_2 is d_ff × d_model (tall). Thin lines mark the n_heads slices of
    width d = d_model / n_heads (columns of W_Q, W_K, W_V; rows of W_O): heads cut the
    matrices up, they add no parameters. Total 4·d_model² + 2·d_model·d_ff.
    """
    d, f, h = d_model, d_ff, n_heads
    attn, ffn = 4 * d * d, 2 * d * f
    s = min(100.0, 400 * d / f)  # px for d_model; d_ff gets s·f/d, so areas stay ∝ counts
    long, g, x0, y0 = s * f / d, 10, 30, 40
    x2 = x0 + max(4 * s + 3 * g, long, 480) + 30  # W_2 stands at the right
    y_legend = y0 + 2 * s + g + 34
    W, H = int(x2 + s + 30), int(max(y0 + long, y_legend + 130) + 24)
    dr = Drawing(_name("parameter_map", d, f, h), W, H,
                 f"The parameters of one Transformer block (d_model = {d}, d_ff = {f})",
                 f"Rectangles with area proportional to parameter count. Attention: W_Q, W_K, W_V and W_O, "
                 f"each {d} × {d} = {d * d:,}, together 4·d_model² = {attn:,}. Feed-forward: W_1 "
                 f"({d} × {f}) and W_2 ({f} × {d}), each {d * f:,}, together 2·d_model·d_ff = {ffn:,}. "
                 f"Total {attn + ffn:,}, biases and norms ignored. The {h} heads cut W_Q, W_K and W_V "
                 f"into column slices (and W_O into row slices) of width {d // h}; they add no parameters.")

    def matrix(x, y, w, hgt, color, name, shape, count):
        dr.rect(x, y, w, hgt, color, 0.18)
        if w >= 90 and hgt >= 70:  # name, shape and count when they fit; else the legend has them
            dr.text(x + w / 2, y + hgt / 2 - 20, name, 17)
            dr.text(x + w / 2, y + hgt / 2 + 2, shape, 13)
            dr.text(x + w / 2, y + hgt / 2 + 20, f"{count:,}", 13)
        elif w >= 36:
            dr.text(x + w / 2, y + hgt / 2, name, 15)

    for k, name in enumerate(["W_{Q}", "W_{K}", "W_{V}", "W_{O}"]):
        x = x0 + k * (s + g)
        for i in range(1, h):  # head slices: columns of W_Q, W_K, W_V; rows of W_O
            t = i * s / h
            pts = ((x + t, y0 + 1), (x + t, y0 + s - 1)) if k < 3 else ((x + 1, y0 + t), (x + s - 1, y0 + t))
            dr.line(*pts, width=0.6, color=BLUE)
        matrix(x, y0, s, s, BLUE, name, f"{d} × {d}", d * d)
    matrix(x0, y0 + s + g, long, s, ORANGE, "W_{1}", f"{d} × {f}", d * f)
    matrix(x2, y0, s, long, ORANGE, "W_{2}", f"{f} × {d}", d * f)
    # legend, in the free space under W_1
    legend = [(BLUE, f"attention: 4·d_{{model}}² = 4 × {d * d:,} = {attn:,}"),
              (ORANGE, f"feed-forward: 2·d_{{model}}·d_{{ff}} = 2 × {d * f:,} = {ffn:,}")]
    for k, (color, label) in enumerate(legend):
        dr.rect(x0, y_legend + 26 * k - 8, 16, 16, color, 0.3, rx=2)
        dr.text(x0 + 24, y_legend + 26 * k, label, 15, anchor="start")
    dr.text(x0, y_legend + 62, f"block total: 4·d_{{model}}² + 2·d_{{model}}·d_{{ff}} = {attn + ffn:,}", 16,
            anchor="start", weight="700")
    dr.text(x0, y_legend + 86, "biases and norms ignored; area ∝ number of parameters", 13, anchor="start")
    dr.text(x0, y_legend + 108, f"thin lines: {h} heads of width d_head = {d // h}; they add no parameters", 13,
            anchor="start")
    dr.text(x0, 20, "one block's weight matrices, drawn rows × columns", 14, anchor="start", weight="600")
    return dr.diagram()


ALL = [qkv_lookup, multihead_split_merge, rope_rotation, alibi_bias_grid, block_wiring, parameter_map]


# ----------------------------------------------------------------------------- chapter 09: linear attention

def _matrix(dr: Drawing, x, y, w, h, label, shape, color, size=15):
    """A matrix drawn as a box with its name inside and its shape under it."""
    dr.rect(x, y, w, h, color, 0.22, rx=3)
    dr.text(x + w / 2, y + h / 2, label, size)
    dr.text(x + w / 2, y + h + 14, shape, 13)


def linear_attention_orders(n: int = 4096, m: int = 64, d_v: int = 64) -> Diagram:
    """The two bracketings of φ(Q)φ(K)ᵀV, with their shapes, FLOPs and the size of what they store.

    (φ(Q)φ(K)ᵀ)V first forms the (n, n) matrix: 2n²m + 2n²d_v FLOPs. φ(Q)(φ(K)ᵀV) first forms
    the (m, d_v) state: 2nmd_v + 2nmd_v FLOPs. Same result (matrix products are associative);
    the printed counts are a product's 2·p·q·r for (p, q) × (q, r), which
    ``torch.utils.flop_counter`` counts too (tests/test_diagrams.py checks it).
    """
    _n_, _m, _dv = int(n), int(m), int(d_v)
    left = 2 * _n_ * _n_ * _m + 2 * _n_ * _n_ * _dv
    right = 4 * _n_ * _m * _dv
    W, H = 800, 440
    dr = Drawing(_name("linear_attention_orders", _n_, _m, _dv), W, H,
                 f"Two orders for φ(Q)φ(K)ᵀV (n = {_n_}, m = {_m}, d_v = {_dv})",
                 f"Top: (φ(Q)φ(K)ᵀ)V multiplies φ(Q), shape ({_n_}, {_m}), by φ(K)ᵀ, shape ({_m}, {_n_}), "
                 f"into an n × n matrix of {_n_ * _n_:,} numbers, then by V: {left:,} FLOPs. Bottom: "
                 f"φ(Q)(φ(K)ᵀV) first multiplies φ(K)ᵀ by V into an m × d_v state of {_m * _dv:,} numbers, "
                 f"then φ(Q) by the state: {right:,} FLOPs. Both give the same output of shape "
                 f"({_n_}, {_dv}); the order of the brackets decides the cost.")
    tall, thin, big, small = 110, 26, 110, 40
    for row, y in enumerate((66, 270)):
        dr.text(20, y - 32, ("(φ(Q) φ(K)ᵀ) V — the n × n matrix first", "φ(Q) (φ(K)ᵀ V) — the m × d_{v} state first")[row],
                16, anchor="start", weight="700")
        _matrix(dr, 40, y, thin, tall, "φ(Q)", f"({_n_}, {_m})", BLUE, 13)
        dr.text(100, y + tall / 2, "×", 18)
        if row == 0:
            _matrix(dr, 118, y + (tall - thin) / 2, big, thin, "φ(K)ᵀ", f"({_m}, {_n_})", ORANGE, 13)
            dr.text(250, y + tall / 2, "=", 18)
            _matrix(dr, 270, y, big, tall, "A", f"({_n_}, {_n_})", VERMILLION)
            dr.text(398, y + tall / 2, "×", 18)
            _matrix(dr, 414, y, thin, tall, "V", f"({_n_}, {_dv})", SKY, 13)
            dr.text(466, y + tall / 2, "=", 18)
        else:
            dr.text(124, y + tall / 2, "(", 40)
            _matrix(dr, 138, y + (tall - thin) / 2, big, thin, "φ(K)ᵀ", f"({_m}, {_n_})", ORANGE, 13)
            dr.text(266, y + tall / 2, "×", 18)
            _matrix(dr, 284, y, thin, tall, "V", f"({_n_}, {_dv})", SKY, 13)
            dr.text(326, y + tall / 2, ")", 40)
            dr.text(346, y + tall / 2, "=", 18)
            _matrix(dr, 366, y + (tall - small) / 2 - 14, small, small, "S", f"({_m}, {_dv})", PURPLE)
            dr.arrow((414, y + tall / 2), (474, y + tall / 2), label="φ(Q)·", size=13)
        _matrix(dr, 486, y, thin, tall, "O", f"({_n_}, {_dv})", GREEN, 13)
        flops, formula, stored, tail = ((left, "2n²m + 2n²d_{v}: grows as n²", f"stores n² = {_n_ * _n_:,}",
                                         "numbers"),
                                        (right, "2nmd_{v} + 2nmd_{v}: grows as n",
                                         f"stores m·d_{{v}} = {_m * _dv:,}", "numbers, whatever n is"))[row]
        dr.text(560, y + 18, f"{flops:,} FLOPs", 15, anchor="start", weight="600")
        dr.text(560, y + 44, formula, 14, anchor="start")
        dr.text(560, y + 72, stored, 14, anchor="start")
        dr.text(560, y + 92, tail, 14, anchor="start")
    dr.line((20, 216), (W - 20, 216), width=1, dashed=True)
    dr.text(W / 2, H - 18, f"same output; the first order costs {left / right:.3g}× the second here "
            "(the ratio is n(m + d_{v}) / 2md_{v})", 14)
    return dr.diagram()


def recurrent_state(alpha=None, m: int = 4, d_v: int = 4) -> Diagram:
    """Causal linear attention's state as an m × d_v memory, written by an outer product, read by a query.

    Plain linear attention (``alpha`` None): write S_t = S_{t−1} + φ(k_t) v_tᵀ and the normaliser
    z_t = z_{t−1} + φ(k_t); read o_t = S_tᵀ φ(q_t) / z_tᵀ φ(q_t). The state (S, z) holds m(d_v + 1)
    numbers. Gated linear attention (``alpha``, one decay in (0, 1] per key dimension, length m):
    S_t = Diag(α_t) S_{t−1} + k_t v_tᵀ, o_t = S_tᵀ q_t, no feature map and no normaliser; row c
    of the old state is multiplied by α_c (rows of S_{t−1} are shaded by α).
    """
    if alpha is not None:
        alpha = tuple(float(a) for a in alpha)
        m = len(alpha)
    cell, top = 30, 96
    gated = alpha is not None
    gh = m * cell
    W, H = 800, top + gh + 150
    key, query = ("k_{t}", "q_{t}") if gated else ("φ(k_{t})", "φ(q_{t})")
    what = ("S_{t} = Diag(α_{t}) S_{t−1} + k_{t} v_{t}ᵀ,   α_{t} = (" + ", ".join(f"{a:g}" for a in alpha) + ")"
            if gated else "S_{t} = S_{t−1} + φ(k_{t}) v_{t}ᵀ,   z_{t} = z_{t−1} + φ(k_{t})")
    read = "o_{t} = S_{t}ᵀ q_{t}" if gated else "o_{t} = S_{t}ᵀφ(q_{t}) / z_{t}ᵀφ(q_{t})"
    size = m * d_v if gated else m * (d_v + 1)
    dr = Drawing(_name("recurrent_state", alpha, m, d_v), W, H,
                 "The recurrent state of " + ("gated " if gated else "") + "linear attention",
                 f"An {m} × {d_v} grid is the state S. The new key {_plain(key)} (a column of {m} numbers) "
                 f"and value v_t (a row of {d_v}) form the outer product, an {m} × {d_v} grid. "
                 + ("Each row c of the previous state is first multiplied by its decay α_c, so rows with "
                    "small α forget quickly. " if gated else "It is added to the previous state, which "
                    "forgets nothing, and the key itself is added to the normaliser z, a column of "
                    f"{m} numbers beside S. ")
                 + f"The query {_plain(query)} then reads the state: {_plain(read)}, a row of {d_v} numbers. "
                 f"The update is {_plain(what)}; the state holds {size} numbers whatever t is.")

    def grid(x, y, rows, cols, color, shades=None):
        for i in range(rows):
            for j in range(cols):
                op = 0.12 + 0.55 * (shades[i] if shades else 0.6)
                dr.rect(x + j * cell, y + i * cell, cell, cell, color, op, stroke=INK, width=0.6)

    y0 = top
    dr.text(20, 28, "write", 16, anchor="start", weight="700")
    dr.text(20, 52, what, 14, anchor="start")
    grid(20, y0, m, 1, ORANGE)
    dr.text(20 + cell / 2, y0 - 14, key, 14)
    dr.text(20 + cell + 16, y0 + gh / 2, "⊗", 18)
    grid(20 + cell + 32, y0 + gh / 2 - cell / 2, 1, d_v, SKY)
    dr.text(20 + cell + 32 + d_v * cell / 2, y0 + gh / 2 - cell / 2 - 14, "v_{t}ᵀ", 14)
    x_prev = 20 + cell + 32 + d_v * cell + 34
    dr.text(x_prev - 16, y0 + gh / 2, "+", 20)
    grid(x_prev, y0, m, d_v, PURPLE, shades=alpha)
    if gated:
        dr.text(x_prev + d_v * cell / 2, y0 - 14, "Diag(α_{t}) S_{t−1}", 14)
        for i, a in enumerate(alpha):
            dr.text(x_prev + 6 + d_v * cell, y0 + i * cell + cell / 2, f"× {a:g}", 13, anchor="start")
        x_new = x_prev + d_v * cell + 76
    else:
        dr.text(x_prev + d_v * cell / 2, y0 - 14, "S_{t−1}", 14)
        x_new = x_prev + d_v * cell + 36
    dr.text(x_new - 18, y0 + gh / 2, "=", 20)
    grid(x_new, y0, m, d_v, PURPLE)
    dr.text(x_new + d_v * cell / 2, y0 - 14, "S_{t}", 14)
    x_end = x_new + d_v * cell
    if not gated:                                  # the normaliser z_t beside S_t
        grid(x_end + 10, y0, m, 1, VERMILLION)
        dr.text(x_end + 10 + cell / 2, y0 - 14, "z_{t}", 14)
        x_end += 10 + cell
    # read: the query weights the rows of S_t, the column sums give o_t under it
    x_q = x_end + 60
    dr.text(x_q - 10, 28, "read", 16, anchor="start", weight="700")
    dr.text(x_q - 10 if gated else W - 12, 52, read, 14, anchor="start" if gated else "end")
    grid(x_q, y0, m, 1, BLUE)
    dr.text(x_q + cell / 2, y0 - 14, query, 14)
    dr.arrow((x_q - 6, y0 + gh / 2), (x_end + 8, y0 + gh / 2))
    y_o = y0 + gh + 40
    dr.arrow((x_new + d_v * cell / 2, y0 + gh + 6), (x_new + d_v * cell / 2, y_o - 6))
    grid(x_new, y_o, 1, d_v, GREEN)
    dr.text(x_new + d_v * cell + 14, y_o + cell / 2,
            "o_{t}" if gated else "o_{t}  (divided by z_{t}ᵀφ(q_{t}))", 14, anchor="start")
    note = ("rows of S_{t−1} shaded by their decay: α near 0 forgets, α = 1 keeps; no normaliser"
            if gated else "nothing is ever forgotten: S_{t} is the sum of every φ(k_{s})v_{s}ᵀ with s ≤ t")
    dr.text(W / 2, H - 40, note, 14)
    dr.text(W / 2, H - 18, (f"the memory S holds m·d_{{v}} = {size} numbers at every step t" if gated else
                            f"the state (S, z) holds m(d_{{v}} + 1) = {size} numbers at every step t"), 14)
    return dr.diagram()


ALL += [linear_attention_orders, recurrent_state]


# ----------------------------------------------------------------------------- chapter 07: FlashAttention

def hbm_sram_loop(t_r: int = 4, t_c: int = 5, i: int = 1, j: int = 2) -> Diagram:
    """FlashAttention-2's loop between HBM and on-chip SRAM, at query block i and key block j.

    Left, HBM (large, slow): Q and O cut into t_r row blocks, K and V into t_c row blocks, and
    the log-sum-exp L. Right, SRAM (small, fast): what one program holds: Q_i, the key and value
    blocks K_j, V_j of the current step, the score tile S_ij, and per row m, ℓ and the
    unnormalised output o. Arrows: Q_i is read once, K_j and V_j once per step (t_c steps),
    O_i and L_i are written once, after the last step. S and P never reach HBM.
    """
    W, H = 900, 570
    dr = Drawing(_name("hbm_sram_loop", t_r, t_c, i, j), W, H,
                 f"FlashAttention-2 between HBM and SRAM: query block {i + 1} of {t_r}, key block {j + 1} of {t_c}",
                 f"HBM on the left holds Q and O in {t_r} row blocks, K and V in {t_c} row blocks, and the "
                 f"log-sum-exp L. SRAM on the right holds what one program works on: the query block Q_{i + 1}, "
                 f"the current key and value blocks K_{j + 1} and V_{j + 1}, the score tile S = Q_{i + 1}K_{j + 1}ᵀ, "
                 f"and per query row the running max m, normaliser ℓ and unnormalised output o. The outer loop "
                 f"runs over query blocks (one program each, in parallel); the inner loop streams the {t_c} key "
                 f"blocks through SRAM. Q_{i + 1} is read once, each K_j and V_j once per query block, and "
                 f"O_{i + 1} and L_{i + 1} are written once at the end. The n × m matrices S and P never reach HBM.")
    dr.text(165, 24, "HBM (off chip): large, slow", 16, weight="700")
    dr.text(692, 24, "SRAM (on chip): small, fast", 16, weight="700")
    dr.rect(15, 42, 320, 430, INK, 0.04, rx=10, dashed=True)
    dr.rect(500, 42, 385, 430, GREEN, 0.06, rx=10)
    # HBM matrices: Q, K, V, O as columns of blocks; L a thin column
    top, height = 80, 340
    cols = [("Q", 35, t_r, i, BLUE), ("K", 105, t_c, j, ORANGE), ("V", 175, t_c, j, ORANGE),
            ("O", 245, t_r, i, PURPLE)]
    for name, x, count, hot, color in cols:
        dr.text(x + 24, top - 18, name, 16, weight="600")
        bh = height / count
        for b in range(count):
            on = b == hot
            dr.rect(x, top + b * bh, 48, bh, color, 0.55 if on else 0.12, stroke=INK if on else color,
                    width=2 if on else 1)
        dr.text(x + 24, top + hot * bh + bh / 2, f"{name}{_sub(hot + 1)}", 14, weight="600")
    dr.text(301, top - 18, "L", 16, weight="600")
    bh = height / t_r
    for b in range(t_r):
        dr.rect(293, top + b * bh, 16, bh, VERMILLION, 0.5 if b == i else 0.12, width=1)
    dr.text(175, 462, "never stored: S, P (n × m)", 14, italic=True)
    # SRAM contents
    dr.box(515, 62, 105, 52, f"Q{_sub(i + 1)}", "B_{r} × d", BLUE)
    dr.box(632, 62, 124, 52, f"K{_sub(j + 1)}, V{_sub(j + 1)}", "B_{c} × d each", ORANGE)
    dr.box(515, 130, 241, 60, f"S = Q{_sub(i + 1)}K{_sub(j + 1)}ᵀ/√d,  P̃ = e^(S − m')", "B_{r} × B_{c} tile", SKY)
    dr.rect(768, 62, 104, 128, GREEN, 0.12, rx=6)
    for k, label in enumerate(["per row:", "m (max)", "ℓ (sum)", "o (B_{r} × d)"]):
        dr.text(820, 82 + k * 30, label, 14, weight="600" if k == 0 else None)
    loop = ["for each query block i (outer, in parallel):",
            "  load Q_{i};  m = −∞, ℓ = 0, o = 0",
            "  for each key block j (inner, in order):",
            "    load K_{j}, V_{j};  S = Q_{i}K_{j}ᵀ/√d",
            "    m' = max(m, rowmax S);  P̃ = e^(S − m')",
            "    ℓ = e^(m − m')ℓ + rowsum P̃",
            "    o = e^(m − m')o + P̃V_{j};  m = m'",
            "  write O_{i} = o / ℓ,  L_{i} = m + log ℓ"]
    for k, line in enumerate(loop):
        indent = (len(line) - len(line.lstrip())) * 7
        dr.text(516 + indent, 226 + k * 28, line.strip(), 14, anchor="start",
                weight="600" if k in (0, 2) else None)
    # traffic arrows between HBM blocks and SRAM
    # reads run down the gaps between the HBM columns to lanes under them, so no arrow
    # crosses a matrix it does not come from
    qy = top + i * (height / t_r) + height / t_r / 2
    ky = top + j * (height / t_c) + height / t_c / 2
    lane_kv, lane_q = top + height + 12, top + height + 22
    dr.arrow((83, qy), (94, qy), (94, lane_q), (486, lane_q), (486, 82), (513, 82),
             color=BLUE, width=2)
    for x_edge in (153, 223):                                 # K_j and V_j
        dr.line((x_edge, ky), (x_edge + 11, ky), (x_edge + 11, lane_kv), (470, lane_kv),
                color=ORANGE, width=2)
    dr.arrow((470, lane_kv), (470, 52), (694, 52), (694, 60), color=ORANGE, width=2)
    wy = top + i * bh + bh / 2
    dr.arrow((513, 180), (455, 180), (455, wy), (311, wy), color=PURPLE, width=2, dashed=True)
    dr.text(410, lane_q + 18, "Q_{i}: once", 14)
    dr.text(410, lane_kv - 6, f"K_{{j}}, V_{{j}}: {t_r}×", 14)
    dr.text(383, wy - 8, "O_{i}, L_{i}", 14)
    dr.text(W / 2, 498, "solid: reads from HBM; dashed: the only writes (O_{i} and L_{i}, after the last key block)",
            14)
    dr.text(W / 2, 524, f"K and V cross the bus once per query block ({t_r}× in all); Q, O and L once: "
            "B_{r} sets the traffic", 14)
    dr.text(W / 2, 550, "FlashAttention-1 swaps the loops: K_{j}, V_{j} outer, and O_{i}, ℓ, m re-read and "
            "re-written on every pass", 14)
    return dr.diagram()


def online_softmax_state(scores=(1.0, 3.0, 0.5, 2.0, 4.0, -1.0), values=(1.0, -1.0, 2.0, 0.0, 1.0, 3.0),
                         block: int = 2) -> Diagram:
    """The online softmax's state (m, ℓ, o) moving along one row of scores, ``block`` entries at a time.

    Left: the empty state (−∞, 0, 0), the merge's identity.
    Top: the scores s_j and values v_j (one number each, d_v = 1), in blocks. Under each block:
    the state after it, m = running max, ℓ = Σ e^(s − m), o = Σ e^(s − m) v, all relative to the
    current m; between states the factor e^(m − m') that rescales the old ℓ and o when the max
    moves. At the end O = o/ℓ, which equals softmax(s)·v (computed here with torch).
    """
    s = torch.tensor([float(x) for x in scores], dtype=torch.float64)
    v = torch.tensor([float(x) for x in values], dtype=torch.float64)
    if s.shape != v.shape or s.numel() == 0 or block < 1:
        raise ValueError(f"online_softmax_state: scores and values must be equal, non-empty lengths and "
                         f"block >= 1, got {s.numel()}, {v.numel()}, block={block}")
    states, m, l, o = [], float("-inf"), 0.0, 0.0
    for start in range(0, s.numel(), block):
        sb, vb = s[start:start + block], v[start:start + block]
        m_new = max(m, sb.max().item())
        factor = math.exp(m - m_new) if m != float("-inf") else 0.0
        p = torch.exp(sb - m_new)
        l = factor * l + p.sum().item()
        o = factor * o + (p * vb).sum().item()
        states.append((start, start + sb.numel(), m_new, l, o, factor, m))
        m = m_new
    exact = (torch.softmax(s, 0) @ v).item()
    nb, cell = len(states), 56
    gap = 64
    bw = [(e - st) * cell for st, e, *_ in states]
    W = int(max(36 + 76 + gap + sum(bw) + gap * (nb - 1) + 40, 560))
    H = 360
    dr = Drawing(_name("online_softmax_state", tuple(s.tolist()), tuple(v.tolist()), block), W, H,
                 f"The online softmax state (m, ℓ, o) along one row, {block} scores at a time",
                 "The state starts empty, m = −∞, ℓ = 0, o = 0. One row of scores " + ", ".join(f"{x:g}" for x in s.tolist()) + " with values "
                 + ", ".join(f"{x:g}" for x in v.tolist()) + f", read {block} at a time. After each block the "
                 "state is the running max m, the sum ℓ of e^(s − m) and the sum o of e^(s − m)·v, both relative "
                 "to the current m; when m grows, the old ℓ and o are multiplied by e^(m_old − m_new). The final "
                 f"output o/ℓ = {o / l:.4f} equals softmax(s)·v = {exact:.4f}.")
    x, w0 = 36, 76                                           # the state before any key
    dr.text(x + w0 / 2, 166, "start", 14, italic=True)
    dr.box(x, 178, w0, 96, "", "", INK, fill_opacity=0.06)
    for r, txt in enumerate(["m₀ = −∞", "ℓ₀ = 0", "o₀ = 0"]):
        dr.text(x + w0 / 2, 200 + r * 26, txt, 14)
    x += w0 + gap
    for k, (st, e, m_new, l_k, o_k, factor, m_old) in enumerate(states):
        w = (e - st) * cell
        dr.rect(x - 3, 44, w + 6, 94, PALETTE[k % len(PALETTE)], 0.08, rx=6)
        for t in range(st, e):
            cx = x + (t - st) * cell
            dr.rect(cx + 3, 52, cell - 6, 36, BLUE, 0.18, rx=4)
            dr.text(cx + cell / 2, 70, _minus(f"{s[t].item():g}"), 15)
            dr.rect(cx + 3, 94, cell - 6, 36, ORANGE, 0.18, rx=4)
            dr.text(cx + cell / 2, 112, _minus(f"{v[t].item():g}"), 15)
        dr.arrow((x + w / 2, 140), (x + w / 2, 176))
        dr.box(x - 3, 178, w + 6, 96, "", "", GREEN, fill_opacity=0.12)
        for r, txt in enumerate([f"m = {m_new:.2f}", f"ℓ = {l_k:.3f}", f"o = {o_k:.3f}"]):
            dr.text(x + w / 2, 200 + r * 26, _minus(txt), 14)
        if not k:                                            # from the empty state
            dr.arrow((x - gap - 2, 226), (x - 5, 226))
        else:
            grew = m_new > m_old
            dr.text(x - gap / 2 - 3, 208, "×" + (f"{factor:.2f}" if grew else "1"), 14,
                    color=VERMILLION if grew else INK, weight="600")
            dr.arrow((x - gap - 2, 226), (x - 5, 226), color=VERMILLION if grew else INK)
        x += w + gap
    dr.text(16, 70, "s", 15, italic=True)
    dr.text(16, 112, "v", 15, italic=True)
    dr.text(W / 2, 24, f"one row, read {block} scores at a time; the state after each block", 15, weight="600")
    dr.text(W / 2, 306, "red: the max grew, so the old ℓ and o are rescaled by e^(m_old − m_new)", 14)
    dr.text(W / 2, 336, _minus(f"at the end O = o / ℓ = {o / l:.4f} = softmax(s)·v = {exact:.4f}"), 15,
            weight="700")
    return dr.diagram()


ALL += [hbm_sram_loop, online_softmax_state]


# ----------------------------------------------------------------------------- chapter 08: sparse attention

def window_kernel_tiles(n: int = 512, block: int = 64, window: int = 80, causal: bool = False,
                        step: int = 3) -> Diagram:
    """The score matrix of a sliding window cut into (B × B) tiles: full, partial and skipped.

    A tile inside the band |i − j| ≤ w (causal: 0 ≤ i − j ≤ w) is full and needs no mask; a tile
    the band's edge crosses is partial, computed whole and masked inside; every other tile is
    skipped. The dashed lines are the band's edges; the thick outline is one step of the blocked
    kernel (query block ``step``: B queries against the B + 2w keys they can see). The counts
    come from :func:`attnlab.sparse.tile_classes` and :func:`attnlab.sparse.window_tiles`.
    """
    from . import sparse

    if not (isinstance(n, int) and isinstance(block, int) and 0 < block <= n and n <= 16 * block):
        raise ValueError(f"window_kernel_tiles: needs 0 < block <= n <= 16·block, got n={n}, block={block}")
    if not isinstance(window, int) or window < 0:
        raise ValueError(f"window_kernel_tiles: window must be a non-negative int, got {window!r}")
    classes = sparse.tile_classes(sparse.sliding_window_mask(n, window, causal=causal), block)
    t = classes.shape[0]
    step = min(max(int(step), 0), t - 1)
    full, partial = int((classes == 2).sum()), int((classes == 1).sum())
    skipped = t * t - full - partial
    visited = sparse.window_tiles(n, block, window, causal=causal)
    assert visited == full + partial
    G, x0, y0 = 400, 70, 70
    px = G / n
    W, H = 560, y0 + G + 250
    kind = "causal " if causal else ""
    dr = Drawing(_name("window_kernel_tiles", n, block, window, causal, step), W, H,
                 f"Tiles of a {kind}sliding window: n = {n}, B = {block}, w = {window}",
                 f"The {n} × {n} score matrix cut into {t} × {t} tiles of {block} × {block}. The band of "
                 f"allowed pairs ({'0 ≤ i − j ≤ w' if causal else '|i − j| ≤ w'}, w = {window}) covers {full} "
                 f"tiles completely (full: computed without a mask), crosses {partial} (partial: computed whole, "
                 f"masked inside) and misses {skipped} (skipped). The kernel computes {visited} tiles where dense "
                 f"attention computes {t * t}. One step of the kernel, query block {step} (numbered from 0), is outlined: "
                 f"its queries against every key within w of them.")
    hatch = dr.hatch()
    dr.text(x0 + G / 2, y0 - 40, "keys j →", 15)
    dr.text(x0 - 36, y0 + G / 2, "queries i →", 15, rotate=-90)
    for i in range(t):
        for j in range(t):
            c = int(classes[i, j])
            x, y = x0 + j * block * px, y0 + i * block * px
            w_, h_ = min(block, n - j * block) * px, min(block, n - i * block) * px
            if c == 2:
                dr.rect(x, y, w_, h_, GREEN, 0.55, stroke=INK, width=0.8)
            elif c == 1:
                dr.rect(x, y, w_, h_, ORANGE, 0.35, stroke=INK, width=0.8)
            else:
                dr.rect(x, y, w_, h_, f"url(#{hatch})", 1, stroke=INK, width=0.8)
    for i in range(t):
        dr.text(x0 - 12, y0 + (i + 0.5) * block * px, str(i), 13)        # blocks from 0, as in the code
        dr.text(x0 + (i + 0.5) * block * px, y0 - 14, str(i), 13)

    def edge(offset):  # the line j = i − offset inside the square
        a, b = max(0, offset), min(n, n + offset)
        dr.line((x0 + (a - offset) * px, y0 + a * px), (x0 + (b - offset) * px, y0 + b * px),
                width=2, dashed=True)

    for offset in ((0, window) if causal else (-window, window)):
        edge(offset)
    q0, q1 = step * block, min(step * block + block, n)
    k0, k1 = max(q0 - window, 0), q1 if causal else min(q1 + window, n)
    dr.rect(x0 + k0 * px, y0 + q0 * px, (k1 - k0) * px, (q1 - q0) * px, BLUE, 0.0, stroke=BLUE, width=3.5)
    ly = y0 + G + 24
    items = [(GREEN, 0.55, f"full: {full}", "no mask"),
             (ORANGE, 0.35, f"partial: {partial}", "masked inside"),
             (f"url(#{hatch})", 1, f"skipped: {skipped}", "never computed")]
    for k, (color, op, label, sub) in enumerate(items):
        lx = 20 + k * 180
        dr.rect(lx, ly, 30, 30, color, op, stroke=INK, width=0.8)
        dr.text(lx + 40, ly + 7, label, 15, anchor="start", weight="600")
        dr.text(lx + 40, ly + 25, sub, 14, anchor="start")
    dense = t * (t + 1) // 2 if causal else t * t
    lines = [f"tiles computed: {visited} of {t * t} ({'causal ' if causal else ''}dense: {dense})",
             "dashed: the band's edges, " + ("i − j = 0 and i − j = w" if causal else "i − j = ±w"),
             f"blue: one kernel step (query block {step}), {q1 - q0} queries × {k1 - k0} keys",
             f"(B + {'w' if causal else '2w'} keys, cut at the edges of the matrix)",
             "a GPU computes a tile whole or skips it whole:",
             "the saving is the skipped tiles"]
    for k, line in enumerate(lines):
        dr.text(20, ly + 62 + k * 24, line, 14, anchor="start", weight="600" if k in (0, 5) else None)
    return dr.diagram()


def rolling_cache(slots: int = 4, t: int = 9) -> Diagram:
    """A sliding window's rolling KV cache after position t: S slots, position p in slot p mod S.

    Top: positions 0..t; the last S (t − S + 1..t) are live, older ones were overwritten. Bottom:
    the S slots with the position each holds, and the write pointer at slot t mod S (just
    written). The live positions are exactly the keys a causal window of radius S − 1 lets
    query t see; the slots are not in position order, which attention does not mind (a softmax
    over keys does not depend on their order once positions are encoded in them).
    """
    if not (isinstance(slots, int) and isinstance(t, int) and 1 <= slots <= 8 and 0 <= t <= 15):
        raise ValueError(f"rolling_cache: needs 1 <= slots <= 8 and 0 <= t <= 15, got slots={slots}, t={t}")
    holds = [None] * slots
    for p in range(t + 1):                      # the cache, written one position at a time
        holds[p % slots] = p
    live = [p for p in holds if p is not None]
    cell, x0 = 46, 20
    W = max(x0 * 2 + (t + 1) * cell, 40 + slots * 110, 520)
    H = 430
    dr = Drawing(_name("rolling_cache", slots, t), W, H,
                 f"A rolling KV cache of {slots} slots after position {t}",
                 f"Positions 0 to {t} were written in turn; position p goes to slot p mod {slots}. Live now: "
                 f"positions {min(live)} to {max(live)}, one per slot (slot s holds "
                 + ", ".join(f"{s}: {p}" for s, p in enumerate(holds) if p is not None)
                 + f"); older positions were overwritten. The write pointer is at slot {t % slots}. Query {t} "
                 f"attends to every live slot, exactly the window of the last {slots} positions; the cache "
                 f"never grows.")
    dr.text(x0, 26, "positions written so far (newest on the right)", 15, anchor="start", weight="600")
    for p in range(t + 1):
        x = x0 + p * cell
        alive = p in live
        dr.rect(x + 3, 46, cell - 6, 40, BLUE if alive else INK, 0.35 if alive else 0.06, rx=4,
                stroke=BLUE if alive else INK, dashed=not alive)
        dr.text(x + cell / 2, 66, str(p), 15, weight="600" if alive else None)
    dr.text(x0, 104, f"dashed: overwritten; blue: live (the last {slots}), an arrow to its slot", 14,
            anchor="start")
    sy, sw = 200, 96
    sx = (W - slots * (sw + 14)) / 2
    dr.text(W / 2, sy + 142, f"the cache: {slots} slots, position p in slot p mod {slots}", 15, weight="600")
    for s, p in enumerate(holds):
        x = sx + s * (sw + 14)
        newest = p == t
        dr.rect(x, sy, sw, 54, GREEN if newest else SKY, 0.45 if newest else 0.2, rx=6,
                stroke=INK if newest else None, width=2.5 if newest else 1.5)
        dr.text(x + sw / 2, sy + 16, f"slot {s}", 14)
        dr.text(x + sw / 2, sy + 37, "empty" if p is None else f"p = {p}", 15, weight="600")
        if p is not None:
            px_ = x0 + p * cell + cell / 2
            dr.arrow((px_, 88), (x + sw / 2, sy - 4), color=GREEN if newest else INK,
                     width=2 if newest else 1.2)    # live positions: solid (dashed = overwritten)
    wx = sx + (t % slots) * (sw + 14) + sw / 2
    dr.arrow((wx, sy + 96), (wx, sy + 58), color=GREEN, width=2.5)
    dr.text(wx, sy + 110, f"write pointer: {t} mod {slots} = {t % slots}", 14, weight="600")
    dr.text(W / 2, H - 44, f"query {t} reads all {len(live)} slots: the window i − {slots - 1} ≤ j ≤ i", 14)
    dr.text(W / 2, H - 20, f"memory stays at {slots} slots however long the sequence", 14)
    return dr.diagram()


ALL += [window_kernel_tiles, rolling_cache]


# ----------------------------------------------------------------------------- chapter 09: chunked linear attention

def chunk_decomposition(chunks: int = 4, C: int = 4) -> Diagram:
    """The causal weight matrix of linear attention split into chunks of C tokens.

    Diagonal blocks (a chunk against itself, masked) are computed in the parallel form,
    tril(φ(Q_c)φ(K_c)ᵀ)V_c; every block left of the diagonal is never formed: it reaches the
    chunk through the carried state, φ(Q_c)S_c, with S_{c+1} = S_c + φ(K_c)ᵀV_c. Of the
    n(n + 1)/2 causal pairs (n = chunks·C), n(C + 1)/2 lie in diagonal blocks and n(n − C)/2 go
    through the state.
    """
    chunks, C = int(chunks), int(C)
    n = chunks * C
    diag_pairs, state_pairs = n * (C + 1) // 2, n * (n - C) // 2
    cell = min(22, 300 // n)
    side = n * cell
    W, H = 800, max(side + 70, 150 + chunks * 66) + 80
    x0, y0 = 40, 70
    dr = Drawing(_name("chunk_decomposition", chunks, C), W, H,
                 f"Chunked linear attention: {chunks} chunks of {C} tokens",
                 f"The causal {n} × {n} weight matrix, queries down, keys across. The {chunks} diagonal "
                 f"blocks, each a chunk against itself with the future masked, are computed in the "
                 f"parallel form: {diag_pairs} pairs. The blocks left of the diagonal, {state_pairs} pairs, are "
                 f"never formed: chunk c reads them through the state S_c, the sum of φ(k)vᵀ over all earlier "
                 f"chunks, and the state is updated once per chunk, S_c+1 = S_c + φ(K_c)ᵀV_c. Above the "
                 f"diagonal is the future, masked.")
    dr.text(x0, 30, "the causal weight matrix (queries ↓, keys →)", 15, anchor="start", weight="700")
    for i in range(n):
        for j in range(i + 1):
            same = i // C == j // C
            dr.rect(x0 + j * cell, y0 + i * cell, cell, cell, ORANGE if same else PURPLE,
                    0.5 if same else 0.18, stroke=INK, width=0.4)
    for c in range(1, chunks):
        dr.line((x0, y0 + c * C * cell), (x0 + c * C * cell, y0 + c * C * cell), width=2)
        dr.line((x0 + c * C * cell, y0 + c * C * cell), (x0 + c * C * cell, y0 + side), width=2)
    dr.rect(x0, y0, side, side, INK, 0.0, stroke=INK, width=1.5)
    lx = x0 + side + 40
    dr.rect(lx, 40, 18, 18, ORANGE, 0.5, stroke=INK, width=0.6)
    dr.text(lx + 26, 54, "inside a chunk: the parallel form", 14, anchor="start", weight="600")
    dr.text(lx + 26, 74, f"tril(φ(Q_{{c}})φ(K_{{c}})ᵀ)V_{{c}}: {diag_pairs} pairs", 14, anchor="start")
    dr.rect(lx, 92, 18, 18, PURPLE, 0.18, stroke=INK, width=0.6)
    dr.text(lx + 26, 106, "earlier chunks: through the state", 14, anchor="start", weight="600")
    dr.text(lx + 26, 126, f"φ(Q_{{c}})S_{{c}}: {state_pairs} pairs, never formed", 14, anchor="start")
    # the chain of states, one per chunk
    bw, bh, gap = 64, 34, 66
    for c in range(chunks):
        by = 150 + c * gap
        dr.box(lx + 40, by, bw, bh, f"S_{{{c}}}", color=PURPLE)
        dr.text(lx + 40 + bw + 12, by + bh / 2 + 5, f"read by chunk {c}" + (" (S_{0} = 0)" if c == 0 else ""),
                13, anchor="start")
        if c + 1 < chunks:
            dr.arrow((lx + 40 + bw / 2, by + bh + 2), (lx + 40 + bw / 2, by + gap - 2))
            dr.text(lx + 40 + bw / 2 + 10, by + bh + (gap - bh) / 2 + 5, f"+ φ(K_{{{c}}})ᵀV_{{{c}}}", 13,
                    anchor="start")
    dr.text(W / 2, H - 44, f"n = {n}: {diag_pairs} pairs in diagonal blocks (n(C + 1)/2), "
            f"{state_pairs} through the state (n(n − C)/2)", 14)
    dr.text(W / 2, H - 20, f"one state update per chunk: {chunks} sequential steps instead of {n}", 14)
    return dr.diagram()


ALL += [chunk_decomposition]


# ----------------------------------------------------------------------------- chapter 05: the KV cache

def prefill_decode(prompt: int = 4, t: int = 8, max_len: int = 12) -> Diagram:
    """Prefill, then decode: a preallocated cache of ``max_len`` slots filling up as t grows.

    Row 0 is the prefill: the ``prompt`` tokens go through the model in one pass (a p × p causal
    block of scores) and write slots 0..p − 1 together. Each later row is one decoding step at
    length t: one new token, whose query attends to t + 1 keys and values (the t cached ones
    and its own, labelled "attends to t + 1"), and whose key and value are written into slot t (the write position is the cache's length, which
    is also the new token's position). Slots after it are allocated but empty.
    """
    if not (isinstance(prompt, int) and isinstance(t, int) and isinstance(max_len, int)
            and 1 <= prompt <= t < max_len <= 16 and t - prompt <= 6):
        raise ValueError(f"prefill_decode: needs 1 <= prompt <= t < max_len <= 16 and t - prompt <= 6, "
                         f"got prompt={prompt}, t={t}, max_len={max_len}")
    steps = list(range(prompt, t + 1))          # the length before each decoding step
    cell, x0, y0, row = 40, 150, 74, 60
    W = max(x0 + max_len * cell + 200, 640)
    H = y0 + (len(steps) + 1) * row + 70
    dr = Drawing(_name("prefill_decode", prompt, t, max_len), W, H,
                 f"Prefill of {prompt} tokens, then decoding steps up to length {t + 1}",
                 f"A KV cache preallocated for {max_len} positions. Prefill: the {prompt} prompt tokens run "
                 f"through the model in one pass and write slots 0 to {prompt - 1} at once. Then each decoding "
                 f"step runs one new token: at length t it attends to t + 1 keys and values, the t cached ones and "
                 f"its own, and writes its key and value into slot t, its own position. Shown for t = "
                 + ", ".join(str(s) for s in steps) + f". Slots after the newest stay allocated but empty; the "
                 f"cache holds {t + 1} of {max_len} positions at the end.")
    dr.text(x0, 24, f"a cache of {max_len} slots (preallocated), one per position", 15, anchor="start",
            weight="600")
    for j in range(max_len):
        dr.text(x0 + j * cell + cell / 2, 52, str(j), 13)
    dr.text(x0 - 12, 52, "slot / position", 13, anchor="end")

    def slots(y, written, new):
        for j in range(max_len):
            x = x0 + j * cell
            if j in new:
                dr.rect(x + 2, y, cell - 4, 34, GREEN, 0.5, rx=4, stroke=INK, width=2)
            elif j < written:
                dr.rect(x + 2, y, cell - 4, 34, BLUE, 0.3, rx=4)
            else:
                dr.rect(x + 2, y, cell - 4, 34, INK, 0.04, rx=4, stroke=INK, dashed=True, width=1)

    y = y0
    dr.text(x0 - 12, y + 10, "prefill", 15, anchor="end", weight="600")
    dr.text(x0 - 12, y + 28, f"{prompt} queries", 13, anchor="end")
    slots(y, 0, set(range(prompt)))
    dr.text(x0 + max_len * cell + 12, y + 17, f"writes {prompt}", 14, anchor="start")
    for s in steps:
        y += row
        dr.text(x0 - 12, y + 10, f"step t = {s}", 15, anchor="end", weight="600")
        dr.text(x0 - 12, y + 28, "1 query", 13, anchor="end")
        slots(y, s, {s})
        dr.arrow((x0 + s * cell + cell / 2, y + 36), (x0 + s * cell + cell / 2, y + 44), (x0 + 6, y + 44),
                 color=BLUE, width=1.5)             # the new query reads every cached slot
        dr.text(x0 + max_len * cell + 12, y + 17, f"attends to {s + 1}, writes 1", 14, anchor="start")
    ly = y + row + 6
    dr.rect(x0, ly, 18, 18, GREEN, 0.5, stroke=INK, width=2)
    dr.text(x0 + 26, ly + 9, "written this pass", 14, anchor="start")
    dr.rect(x0 + 180, ly, 18, 18, BLUE, 0.3)
    dr.text(x0 + 206, ly + 9, "cached, read", 14, anchor="start")
    dr.rect(x0 + 330, ly, 18, 18, INK, 0.04, stroke=INK, dashed=True, width=1)
    dr.text(x0 + 356, ly + 9, "allocated, empty", 14, anchor="start")
    dr.text(W / 2, H - 16, "the write position = the cache's length = the new token's position", 14)
    return dr.diagram()


def kv_head_sharing(n_heads: int = 8, kv_heads=(8, 2, 1), head_dim: int = 128) -> Diagram:
    """MHA, GQA and MQA side by side: which key/value head each query head reads, and the cache.

    The grouping is the library's: :func:`attnlab.attention.repeat_kv` is run on the KV-head
    indices, so query head i reads KV head i // (h / h_kv). Under each panel: the values cached
    per token and layer, 2 h_kv d, and how many times ``repeat_kv`` copies each KV head.
    """
    from .attention import repeat_kv

    kv_heads = tuple(int(g) for g in kv_heads)
    if not (1 <= n_heads <= 12 and kv_heads and all(1 <= g <= n_heads and n_heads % g == 0 for g in kv_heads)):
        raise ValueError(f"kv_head_sharing: every KV-head count must divide n_heads={n_heads}, got {kv_heads}")
    names = {n_heads: "MHA", 1: "MQA"}
    pw, gap = 250, 20
    W, H = len(kv_heads) * (pw + gap) + gap, 330
    dr = Drawing(_name("kv_head_sharing", n_heads, kv_heads, head_dim), W, H,
                 f"{n_heads} query heads sharing " + ", ".join(str(g) for g in kv_heads) + " key/value heads",
                 f"Three ways to share keys and values among {n_heads} query heads. "
                 + " ".join(f"With {g} KV head{'s' if g > 1 else ''} ({names.get(g, 'GQA')}) query head i "
                            f"reads KV head "
                            f"i // {n_heads // g}; the cache holds 2 × {g} × {head_dim} = {2 * g * head_dim} "
                            f"values per token and layer, and repeat_kv lines the KV heads up with the queries "
                            + ("without copying." if g == n_heads else f"by copying each {n_heads // g} times "
                               "(a kernel that folds a group's query heads into rows reads it in place).")
                            for g in kv_heads))
    for p, g in enumerate(kv_heads):
        group = repeat_kv(torch.arange(g, dtype=torch.float32).view(g, 1, 1), n_heads // g)
        reads = [int(v) for v in group.flatten().tolist()]      # query head i -> KV head reads[i]
        x = gap + p * (pw + gap)
        dr.text(x + pw / 2, 24, f"{names.get(g, 'GQA')}: h_{{kv}} = {g}", 16, weight="700")
        qw = pw / n_heads
        kw = pw / g
        for i in range(n_heads):
            dr.rect(x + i * qw + 2, 50, qw - 4, 30, PALETTE[reads[i] % 4], 0.35, rx=4)
            dr.text(x + i * qw + qw / 2, 65, f"q{_sub(i)}", 13)
            dr.line((x + i * qw + qw / 2, 82), (x + reads[i] * kw + kw / 2, 178), width=1.2)
        for j in range(g):
            dr.rect(x + j * kw + 3, 180, kw - 6, 44, PALETTE[j % 4], 0.35, rx=6, stroke=INK, width=1.5)
            if kw >= 50:
                dr.text(x + j * kw + kw / 2, 202, f"K,V{_sub(j)}", 13)
            else:                                   # too narrow for one line: K above V
                dr.text(x + j * kw + kw / 2, 193, f"K{_sub(j)}", 13)
                dr.text(x + j * kw + kw / 2, 211, f"V{_sub(j)}", 13)
        dr.text(x + pw / 2, 250, f"cached per token and layer:", 14)
        dr.text(x + pw / 2, 272, f"2 × {g} × {head_dim} = {2 * g * head_dim} values", 14, weight="600")
        dr.text(x + pw / 2, 300, "repeat_kv: no copy" if g == n_heads else
                f"repeat_kv: each KV head {n_heads // g}×", 14)
    return dr.diagram()


ALL += [prefill_decode, kv_head_sharing]


# ----------------------------------------------------------------------------- chapter 04: micro-GPT

def microgpt_architecture(config=None) -> Diagram:
    """MicroGPT from token ids to next-character probabilities, with each part's parameter count.

    Data flow upward: token embedding E and position embedding P are added, ``n_layers`` pre-LN
    blocks (LN → causal multi-head attention → ⊕, LN → FFN → ⊕) update the residual stream, a
    final LayerNorm and the LM head W_U give logits (b, L, V). With ``tie_weights`` the head is E
    itself (a dashed link). The counts come from a :class:`attnlab.models.MicroGPT` built on the
    meta device from ``config`` (default: the book's shipped target, V = 103, L = 64, 3 × 128).
    """
    from .models import GPTConfig, MicroGPT

    if config is None:
        config = GPTConfig(vocab_size=103, max_len=64, n_layers=3, d_model=128, n_heads=4)
    if not isinstance(config, GPTConfig):
        raise TypeError(f"microgpt_architecture: config must be a GPTConfig, got {type(config).__name__}")
    with torch.device("meta"):
        model = MicroGPT(config)
    count = lambda m: sum(p.numel() for p in m.parameters())
    c, total = config, count(model)
    per_block = count(model.blocks[0])
    head = 0 if c.tie_weights else c.vocab_size * c.d_model
    W, H, sx = 760, 700, 240
    tied = "tied to E" if c.tie_weights else "its own V × d matrix"
    dr = Drawing(_name("microgpt_architecture", c.vocab_size, c.max_len, c.n_layers, c.d_model, c.n_heads,
                       c.tie_weights, c.final_norm), W, H,
                 f"MicroGPT: {c.n_layers} blocks of width {c.d_model}, {total:,} parameters",
                 f"Data flows upward. Token ids (b, L) index the token embedding E (V × d = {c.vocab_size} × "
                 f"{c.d_model}) and the position embedding P (L × d = {c.max_len} × {c.d_model}); their sum "
                 f"is the residual stream x (b, L, d). {c.n_layers} pre-LN blocks each add a causal multi-head "
                 f"attention branch and a feed-forward branch to the stream ({per_block:,} parameters per "
                 f"block). A final LayerNorm and the LM head, {tied}, turn the stream into logits (b, L, V), "
                 f"one score per character at every position; a softmax gives the next-character "
                 f"probabilities. Total {total:,} parameters.")
    dr.text(W / 2, 24, f"MicroGPT: V = {c.vocab_size}, L = {c.max_len}, d = {c.d_model}, "
            f"{c.n_heads} heads, {c.n_layers} blocks", 17, weight="700")
    # inputs
    dr.text(sx, 676, "token ids idx (b, L)", 15, italic=True)
    dr.box(46, 600, 190, 44, "token embedding E", "V × d, row idx", color=SKY, size=14)
    dr.box(250, 600, 190, 44, "position embedding P", "L × d, rows 0..L−1", color=SKY, size=14)
    dr.arrow((sx - 60, 662), (141, 646))
    dr.arrow((sx + 60, 662), (345, 646))
    dr.arrow((141, 600), (sx - 14, 566))
    dr.arrow((345, 600), (sx + 14, 566))
    _add(dr, sx, 556)
    dr.text(sx - 24, 556, "x (b, L, d)", 14, anchor="end")
    # the residual stream and one block, repeated
    dr.rect(110, 290, 440, 248, INK, 0.0, stroke=INK, rx=10, dashed=True)
    dr.text(124, 310, f"block × {c.n_layers}", 15, anchor="start", weight="700")
    dr.line((sx, 542), (sx, 266), width=5, color=GREEN)
    for y_from, y_to, label, sub, colour in ((522, 434, "LN → causal attention", f"{c.n_heads} heads, sees j ≤ i",
                                              BLUE),
                                             (410, 322, "LN → feed-forward", f"d → {c.d_ff or 4 * c.d_model} → d",
                                              ORANGE)):
        dr.line((sx, y_from), (440, y_from), (440, y_from - 8))
        dr.arrow((440, y_from - 8), (440, y_from - 14))
        dr.box(340, y_to + 26, 200, y_from - y_to - 40, label, sub, color=colour, size=14)
        dr.arrow((440, y_to + 26), (440, y_to), (sx + 14, y_to))
        _add(dr, sx, y_to)
    dr.text(sx - 16, 456, "residual", 14, anchor="end", color=GREEN, weight="600")
    dr.text(sx - 16, 476, "stream", 14, anchor="end", color=GREEN, weight="600")
    # output
    dr.box(sx - 70, 226, 140, 38, "final LayerNorm" if c.final_norm else "(no final LN)", color=PURPLE)
    dr.arrow((sx, 226), (sx, 200))
    dr.box(sx - 90, 156, 180, 44, "LM head W_{U}", "= E (tied)" if c.tie_weights else "V × d", color=VERMILLION)
    dr.arrow((sx, 156), (sx, 126))
    dr.text(sx, 112, "logits (b, L, V)", 15, italic=True)
    dr.arrow((sx, 98), (sx, 76))
    dr.text(sx, 62, "softmax: p(next character | x_{≤i})", 15)
    if c.tie_weights:
        dr.line((46, 622), (30, 622), (30, 178), (sx - 92, 178), dashed=True, color=VERMILLION, width=2)
        dr.text(38, 400, "one matrix: W_{U} = E", 14, anchor="start", color=VERMILLION, rotate=-90)
    # parameter counts, from the library's model
    rows = [("E (token embedding)", count(model.tok_emb)), ("P (positions)", count(model.pos_emb)),
            (f"blocks ({c.n_layers} × {per_block:,})", c.n_layers * per_block),
            ("final LayerNorm", count(model.norm_f)), ("LM head" + (" (tied: 0)" if c.tie_weights else ""), head)]
    tx = 580
    dr.text(tx, 150, "parameters", 15, anchor="start", weight="700")
    for i, (name, n) in enumerate(rows):
        dr.text(tx, 176 + i * 40, name, 14, anchor="start")
        dr.text(tx, 195 + i * 40, f"{n:,}", 14, anchor="start", weight="600")
    dr.line((tx, 372), (W - 16, 372), width=1)
    dr.text(tx, 392, f"total {total:,}", 15, anchor="start", weight="700")
    return dr.diagram()


def sampling_pipeline(logits=(2.0, 1.6, 1.0, 0.2, -0.5), labels=("e", "␣", "t", "a", "s"),
                      temperature: float = 0.7, top_k: int = 3) -> Diagram:
    """Sampling one token: logits z → z / T → keep the k largest → softmax → draw.

    Four panels of bars, one per stage, with the values printed; the probabilities are
    ``softmax`` of the kept, temperature-scaled logits (the distribution
    :func:`attnlab.models.sample_next` draws from), the dropped tokens get probability 0.
    """
    z = torch.tensor(logits, dtype=torch.float64)
    if z.dim() != 1 or not 2 <= len(z) <= 8 or len(labels) != len(z):
        raise ValueError(f"sampling_pipeline: needs 2 to 8 logits and one label each, got {len(z)} logits, "
                         f"{len(labels)} labels")
    if temperature <= 0 or not 1 <= top_k <= len(z):
        raise ValueError(f"sampling_pipeline: needs temperature > 0 and 1 <= top_k <= {len(z)}, "
                         f"got {temperature}, {top_k}")
    scaled = z / temperature
    kth = torch.topk(scaled, top_k).values[-1]
    kept = scaled >= kth
    p = torch.softmax(scaled.masked_fill(~kept, float("-inf")), 0)
    n = len(z)
    W, H = 760, 370
    dr = Drawing(_name("sampling_pipeline", tuple(logits), tuple(labels), temperature, top_k), W, H,
                 f"Sampling with temperature {temperature:g} and top-{top_k}",
                 "Four stages from left to right. Logits z = " + ", ".join(f"{v:g}" for v in z.tolist())
                 + f"; divided by T = {temperature:g}; only the {top_k} largest kept, the rest set to −∞; "
                 "softmax gives probabilities " + ", ".join(f"{lab}: {v:.2f}" for lab, v in zip(labels, p.tolist()))
                 + "; one token is drawn from them.")
    panels = [("logits z", z, None), (f"z / T   (T = {temperature:g})", scaled, None),
              (f"top-{top_k}: others → −∞", scaled, kept), ("softmax → p", p, None)]
    pw, base, scale = 170, 262, 36
    top = max(max(abs(v) for v in scaled.tolist()), max(abs(v) for v in z.tolist()))
    scale = min(scale, 150 / top)
    for k, (title, values, keep) in enumerate(panels):
        ox = 10 + k * (pw + 20)
        dr.text(ox + pw / 2, 30, title, 15, weight="700")
        bw = (pw - 20) / n
        is_p = k == 3
        zero = base if is_p else 170
        dr.line((ox + 6, zero), (ox + pw - 6, zero), width=1)
        for i, v in enumerate(values.tolist()):
            x = ox + 10 + i * bw
            dropped = keep is not None and not bool(keep[i])
            if dropped:
                dr.text(x + bw / 2, zero - 14, "−∞", 14, color=VERMILLION)
            else:
                h = v * (180 if is_p else scale)
                y, hh = (zero - h, h) if h >= 0 else (zero, -h)
                dr.rect(x + 3, y, bw - 6, max(hh, 1), GREEN if is_p else BLUE, 0.45, rx=2)
                dr.text(x + bw / 2, (y - 10) if h >= 0 else (y + hh + 12), "0" if v == 0 else _minus(f"{v:.2f}"), 13)
            dr.text(x + bw / 2, 290, labels[i], 15, weight="600")
        if k < 3:
            dr.arrow((ox + pw - 2, 110), (ox + pw + 18, 110), width=2)
    dr.text(W / 2, H - 36, "draw one token with these probabilities (torch.multinomial)", 15)
    dr.text(W / 2, H - 14, "T < 1 sharpens, T > 1 flattens; top-k removes the tail before the softmax", 14)
    return dr.diagram()


ALL += [microgpt_architecture, sampling_pipeline]


# ----------------------------------------------------------------------------- chapter 06: differential attention, grokking

def differential_head(scores1=(0.8, 0.5, 3.0, 0.7, 0.4, 0.9), scores2=(0.8, 0.5, 0.6, 0.7, 0.4, 0.9),
                      lam: float | None = None, lambda_init: float = 0.2) -> Diagram:
    """One differential head for one query (Ye et al. 2025, §2.1–2.2): two softmax rows over the same
    keys, the second subtracted with weight λ, applied to one shared V, normalised per head and
    scaled by (1 − λ_init).

    The rows are computed here with torch.softmax from the given scores: A_1 = softmax(scores1),
    A_2 = softmax(scores2), and the difference A_1 − λ A_2 (which sums to 1 − λ). On keys with equal
    scores in both rows (common-mode noise) the difference is e^s (1/Z_1 − λ/Z_2): it cancels
    exactly only at λ* = Z_2/Z_1, the default ``lam=None``; a larger λ overshoots below zero, a
    smaller one leaves some weight. Weight only A_1 gives (the target) survives.
    """
    s1 = torch.tensor(scores1, dtype=torch.float64)
    s2 = torch.tensor(scores2, dtype=torch.float64)
    if s1.dim() != 1 or s1.shape != s2.shape or not 2 <= s1.numel() <= 8:
        raise ValueError(f"differential_head: scores1 and scores2 must be equal-length sequences of 2 to 8 "
                         f"scores, got {len(scores1)} and {len(scores2)}")
    a1, a2 = torch.softmax(s1, 0), torch.softmax(s2, 0)
    lam_star = (torch.logsumexp(s2, 0) - torch.logsumexp(s1, 0)).exp().item()   # Z_2 / Z_1
    exact = lam is None or abs(lam - lam_star) < 1e-9
    lam = lam_star if lam is None else lam
    diff = a1 - lam * a2
    diff = torch.where(diff.abs() < 1e-12, torch.zeros_like(diff), diff)   # no "−0.00"
    m = s1.numel()
    W, H = 800, 470
    cell, x0 = 62, 172
    dr = Drawing(_name("differential_head", tuple(scores1), tuple(scores2), lam, lambda_init), W, H,
                 "A differential attention head",
                 f"One query's two softmax rows over {m} keys. A_1 = softmax(Q_1 K_1ᵀ/√d) = "
                 + ", ".join(f"{v:.2f}" for v in a1) + "; A_2 = softmax(Q_2 K_2ᵀ/√d) = "
                 + ", ".join(f"{v:.2f}" for v in a2) + f". The difference A_1 − λ A_2 with λ = {lam:.2f} is "
                 + ", ".join(f"{v:.2f}" for v in diff) + f": weight both rows give to a key cancels exactly "
                 f"only at λ = Z_2/Z_1 = {lam_star:.2f}, weight "
                 f"only the first gives survives, entries can be negative and the row sums to 1 − λ = "
                 f"{1 - lam:.2f}. The difference multiplies one shared V (width 2d); the head's output is "
                 f"normalised on its own (RMSNorm, a group norm with one group per head) and scaled by "
                 f"1 − λ_init = {1 - lambda_init:.2f}.")
    dr.text(W / 2, 22, "one query, one differential head", 16, weight="700")
    for j in range(m):
        dr.text(x0 + j * cell + cell / 2, 52, f"k{_sub(j + 1)}", 14)

    def row(y, values, label, sub, negative_ok=False):
        dr.text(x0 - 12, y + 20, label, 15, anchor="end", weight="600")
        dr.text(x0 - 12, y + 40, sub, 13, anchor="end")
        for j, v in enumerate(values.tolist()):
            color = VERMILLION if v < 0 else BLUE
            dr.rect(x0 + j * cell + 3, y + 2, cell - 6, 44, color, min(0.85, 0.08 + abs(v)), rx=4, stroke=INK,
                    width=0.6)
            dr.text(x0 + j * cell + cell / 2, y + 24, _minus(f"{v:.2f}"), 14, weight="600")

    row(66, a1, "A_{1}", "softmax(Q_{1}K_{1}ᵀ/√d)")
    row(136, a2, "A_{2}", "softmax(Q_{2}K_{2}ᵀ/√d)")
    dr.text(x0 + m * cell + 14, 160, f"× λ = {lam:.2f}", 15, anchor="start")
    dr.line((x0, 196), (x0 + m * cell, 196), width=1.5)
    dr.text(x0 + m * cell + 14, 196, "subtract", 14, anchor="start")
    row(206, diff, "A_{1} − λA_{2}", f"row sum 1 − λ = {1 - lam:.2f}", True)
    ex = x0 + m * cell
    if exact:
        note = ("λ = Z₂/Z₁: common", "weight cancels exactly")
    elif lam > lam_star:
        note = ("λ > Z₂/Z₁ = " + f"{lam_star:.2f}:", "common weight overshoots")
    else:
        note = ("λ < Z₂/Z₁ = " + f"{lam_star:.2f}:", "common weight remains")
    dr.text(ex + 14, 226, note[0], 13, anchor="start")
    dr.text(ex + 14, 244, note[1], 13, anchor="start")
    if (diff < 0).any():
        dr.text(ex + 14, 262, "negative = pushed away", 13, anchor="start", color=VERMILLION)
    # the rest of the head: shared V, per-head norm, scale
    y = 330
    steps = [("× V", "one V, width 2d", SKY), ("RMSNorm", "per head", PURPLE),
             (f"× (1 − λ_init)", f"= {1 - lambda_init:.2f}", ORANGE), ("head out", "→ concat, W^O", GREEN)]
    bw, gap = 150, 40
    sx = (W - (len(steps) * bw + (len(steps) - 1) * gap)) / 2
    dr.arrow((x0 + m * cell / 2, 256), (sx + bw / 2, y - 4))
    for i, (label, sub, color) in enumerate(steps):
        bx = sx + i * (bw + gap)
        dr.box(bx, y, bw, 56, label, sub, color=color)
        if i + 1 < len(steps):
            dr.arrow((bx + bw + 2, y + 28), (bx + bw + gap - 2, y + 28))
    dr.text(W / 2, H - 48, "λ = exp(λ_{q1}·λ_{k1}) − exp(λ_{q2}·λ_{k2}) + λ_init,  "
            "λ_init(l) = 0.8 − 0.6·exp(−0.3(l − 1))", 14)
    dr.text(W / 2, H - 22, "with λ = 0 the head is one softmax map: standard attention with V of width 2d", 14)
    return dr.diagram()


def modular_clock(p: int = 11, k: int = 3, a: int = 4, b: int = 9) -> Diagram:
    """Nanda et al.'s picture of modular addition: residue t sits at angle ω_k t on a circle
    (ω_k = 2πk/p, one key frequency k), so adding residues adds angles, and the answer
    c = (a + b) mod p is the residue whose angle the sum lands on.

    Left: the p residues placed at ω_k t (a permutation of the circle when k is coprime to p),
    a and b highlighted and the sum angle ω_k(a + b). Right: the identities the network
    computes with the embedding's cos/sin columns, and the readout cos(ω_k(a + b − c)).
    """
    if not (isinstance(p, int) and 3 <= p <= 23):
        raise ValueError(f"modular_clock: p must be an int between 3 and 23, got {p!r}")
    if not (1 <= k <= p // 2 and math.gcd(k, p) == 1):
        raise ValueError(f"modular_clock: k must be in 1..p // 2 and coprime to p={p}, got {k}")
    if not (0 <= a < p and 0 <= b < p):
        raise ValueError(f"modular_clock: a and b must be residues in 0..{p - 1}, got {a}, {b}")
    c = (a + b) % p
    W, H = 800, 430
    cx, cy, r = 200, 215, 150
    dr = Drawing(_name("modular_clock", p, k, a, b), W, H,
                 f"Modular addition as rotation: p = {p}, key frequency k = {k}",
                 f"A circle with the {p} residues t placed at angle ω t, ω = 2π·{k}/{p}. The embedding of t "
                 f"holds cos(ω t) and sin(ω t), its point on this circle. a = {a} and b = {b} are marked; "
                 f"adding their angles lands on the point of c = (a + b) mod {p} = {c}. The network adds the "
                 f"angles with cos(ω(a+b)) = cos ωa cos ωb − sin ωa sin ωb (and the sine identity), and its "
                 f"logit for each candidate c is proportional to cos(ω(a + b − c)), largest at c = {c}. A "
                 f"grokked network uses a few such key frequencies at once; the Fourier transform of its "
                 f"embedding table over the residues finds them.")
    dr.circle(cx, cy, r, width=1.2)
    omega = 2 * math.pi * k / p
    for t in range(p):
        ang = omega * t
        x, y = cx + r * math.cos(ang), cy - r * math.sin(ang)
        role = {a: BLUE, b: ORANGE, c: GREEN}.get(t)
        dr.circle(x, y, 13 if role else 9, color=role or INK, fill_opacity=0.35 if role else 0.0,
                  width=2 if role else 1)
        lx, ly = cx + (r + 28) * math.cos(ang), cy - (r + 28) * math.sin(ang)
        dr.text(lx, ly, str(t), 14, weight="700" if role else None)
    for t, color, name in ((a, BLUE, "a"), (b, ORANGE, "b"), (c, GREEN, "c")):
        ang = omega * t
        dr.arrow((cx, cy), (cx + (r - 16) * math.cos(ang), cy - (r - 16) * math.sin(ang)), color=color,
                 width=2.5 if name == "c" else 1.8)
        dr.text(cx + (r * 0.55) * math.cos(ang) + 12, cy - (r * 0.55) * math.sin(ang) - 10, name, 15,
                color=color, weight="700", italic=True)
    tx = 410
    lines = [(f"p = {p}, key frequency k = {k}, ω = 2π·{k}/{p}", "700"),
             ("residue t sits at angle ωt: E_{t} holds cos ωt, sin ωt", None),
             (f"a = {a}, b = {b}: angles add (mod 2π)", None),
             ("cos ω(a+b) = cos ωa cos ωb − sin ωa sin ωb", None),
             ("sin ω(a+b) = sin ωa cos ωb + cos ωa sin ωb", None),
             ("logit(c) ∝ cos ω(a + b − c)", None),
             (f"largest at c = (a + b) mod p = {c}", "700"),
             ("a grokked network uses a few key k at once;", None),
             ("the DFT of its embedding over t finds them", None)]
    for i, (s, weight) in enumerate(lines):
        dr.text(tx, 60 + i * 38, s, 15, anchor="start", weight=weight,
                color=GREEN if i == 6 else INK)
    return dr.diagram()


ALL += [differential_head, modular_clock]


# ----------------------------------------------------------------------------- chapter 14: frontiers

def mla_compression(d_model: int = 7168, n_heads: int = 128, d_head: int = 128, d_latent: int = 512,
                    d_rope: int = 64) -> Diagram:
    """Multi-head latent attention's path: x_t is down-projected to c_t (cached, with the shared
    RoPE key), and each head's key and value are up-projected from c_t; the absorbed form moves
    W_uk onto the query and W_uv past the weighted sum, so attention reads c_t directly.
    """
    if min(d_model, n_heads, d_head, d_latent, d_rope) < 1:
        raise ValueError(f"mla_compression: all sizes must be >= 1, got {d_model}, {n_heads}, {d_head}, "
                         f"{d_latent}, {d_rope}")
    mha, mla = 2 * n_heads * d_head, d_latent + d_rope
    W, H = 640, 430
    dr = Drawing(_name("mla_compression", d_model, n_heads, d_head, d_latent, d_rope), W, H,
                 "Multi-head latent attention: cache a latent, up-project per head",
                 f"The hidden state x_t of width {d_model} is down-projected by W_dkv to a latent c_t of width "
                 f"{d_latent}, and by W_kr to a rotary key of width {d_rope}; these {mla} numbers are the "
                 f"cache. Each of {n_heads} heads up-projects c_t with W_uk and W_uv to a key and a value of width "
                 f"{d_head}: {mha} numbers per token if cached, {mha / mla:.1f} times more. The absorbed form "
                 f"multiplies W_uk into the query and W_uv after the weighted sum.")
    dr.box(20, 170, 110, 60, "x_{t}", f"width {d_model}", GREEN)
    dr.box(215, 120, 130, 56, "c_{t}", f"latent, {d_latent}", BLUE, fill_opacity=0.35)
    dr.box(215, 230, 130, 56, "kᴿ_{t}", f"RoPE key, {d_rope}", BLUE, fill_opacity=0.35)
    dr.rect(200, 104, 160, 198, BLUE, 0.04, stroke=BLUE, rx=8, dashed=True)
    dr.text(280, 92, f"cached: {mla} numbers per token", 14, weight="600")
    dr.arrow((130, 190), (212, 150), label="W_{dkv} (down)", label_at=(150, 138))
    dr.arrow((130, 210), (212, 258), label="W_{kr}", label_at=(150, 262))
    for i, (y, lab) in enumerate(((40, "k_{t,1} = c_{t} W_{uk,1}"), (100, "v_{t,1} = c_{t} W_{uv,1}"),
                                  (180, f"… {n_heads} heads …"), (250, f"k_{{t,{n_heads}}}"),
                                  (310, f"v_{{t,{n_heads}}}"))):
        if i == 2:
            dr.text(530, y + 22, lab, 14)
            continue
        dr.box(440, y, 180, 44, lab, f"width {d_head}", ORANGE if "k" in lab[:1] else PURPLE, size=13)
        dr.arrow((345, 148), (436, y + 22), color=INK, width=1.1)
    dr.text(515, 20, "per head, not cached", 13, weight="600")
    dr.text(W / 2, H - 46, f"MHA would cache 2 · {n_heads} · {d_head} = {mha} numbers per token and layer", 14)
    dr.text(W / 2, H - 22, "absorbed: q·(c W_{uk}) = (q W_{uk}ᵀ)·c, so attention runs on c_{t} itself", 14)
    return dr.diagram()


def ring_pass(n_devices: int = 4, step: int = 1) -> Diagram:
    """Ring attention at one step: device i holds query block Q_i and the K/V block (i − step) mod P,
    and passes it on to device i + 1 while computing; after P steps every device has seen every block.
    """
    if not (isinstance(n_devices, int) and isinstance(step, int) and 2 <= n_devices <= 8
            and 0 <= step < n_devices):
        raise ValueError(f"ring_pass: needs 2 <= n_devices <= 8 and 0 <= step < n_devices, "
                         f"got n_devices={n_devices}, step={step}")
    import math as _m
    W, H = 600, 470
    cx, cy, R = 300, 225, 150
    holds = [(i - step) % n_devices for i in range(n_devices)]
    dr = Drawing(_name("ring_pass", n_devices, step), W, H,
                 f"Ring attention on {n_devices} devices, step {step}",
                 f"{n_devices} devices on a ring. At step {step} device i keeps its queries Q_i and holds key/value "
                 "block (i − step) mod P: " + ", ".join(f"device {i} holds K/V {j}" for i, j in enumerate(holds))
                 + ". Each computes a partial output with its log-sum-exp, merges it into its running result, and "
                 "sends the block to the next device while receiving one. After P steps every device has seen "
                 "every block.")
    pos = [(cx + R * _m.sin(2 * _m.pi * i / n_devices), cy - R * _m.cos(2 * _m.pi * i / n_devices))
           for i in range(n_devices)]
    for i, (x, y) in enumerate(pos):
        dr.rect(x - 62, y - 34, 124, 68, SKY, 0.18, stroke=INK, rx=8)
        dr.text(x, y - 17, f"device {i}: Q{_sub(i)}", 14, weight="600")
        dr.rect(x - 44, y - 4, 88, 28, ORANGE, 0.35, rx=4)
        dr.text(x, y + 10, f"K{_sub(holds[i])}, V{_sub(holds[i])}", 14)
        nx, ny = pos[(i + 1) % n_devices]
        mx, my = (x + nx) / 2, (y + ny) / 2
        pull = 0.22
        dr.arrow((x + (mx - x) * 0.55 + (cx - mx) * -pull, y + (my - y) * 0.55 + (cy - my) * -pull),
                 (nx + (mx - nx) * 0.55 + (cx - mx) * -pull, ny + (my - ny) * 0.55 + (cy - my) * -pull),
                 color=ORANGE, width=2)
    dr.text(cx, cy - 8, f"step {step} of {n_devices}", 15, weight="600")
    dr.text(cx, cy + 14, "orange: K/V block in flight", 13)
    dr.text(W / 2, H - 34, "each step: Oᵢ, ℓᵢ ← merge(Oᵢ, ℓᵢ, attn(Qᵢ, Kⱼ, Vⱼ)); then send Kⱼ, Vⱼ on", 14)
    dr.text(W / 2, H - 12, f"after {n_devices} steps device i has merged all {n_devices} blocks: exact attention", 14)
    return dr.diagram()


def speculative_step(gamma: int = 4, accepted: int = 2, tokens=("d", "e", "f", " ", "x")) -> Diagram:
    """One step of speculative decoding: the draft proposes γ tokens one by one, the target scores
    all of them in one pass, the first ``accepted`` are kept, the next is replaced by a sample
    from the residual (or, if all γ are kept, a bonus token is added).
    """
    if not (isinstance(gamma, int) and 1 <= gamma <= 6 and 0 <= accepted <= gamma and len(tokens) >= gamma):
        raise ValueError(f"speculative_step: needs 1 <= gamma <= 6, 0 <= accepted <= gamma and at least gamma "
                         f"tokens, got gamma={gamma}, accepted={accepted}, {len(tokens)} tokens")
    cell, x0 = 96, 40
    W, H = max(620, x0 + (gamma + 1) * cell + 20), 380
    emitted = accepted + 1
    dr = Drawing(_name("speculative_step", gamma, accepted, tuple(tokens)), W, H,
                 f"Speculative decoding: {gamma} drafts, {accepted} accepted",
                 f"The draft model runs {gamma} times to propose {gamma} tokens. The target runs once over all of "
                 f"them and gives {gamma + 1} distributions. Drafts 1 to {accepted} pass the test "
                 f"u < p(x)/q(x); " + (f"draft {accepted + 1} is rejected and replaced by a sample from "
                                        f"max(0, p − q); later drafts are discarded. "
                                        if accepted < gamma else "all pass, so a bonus token comes from the "
                                        "target's last distribution. ")
                 + f"The step emits {emitted} tokens for one target pass.")
    dr.text(20, 30, f"draft: {gamma} small passes, one token each", 15, anchor="start", weight="600")
    for i in range(gamma):
        x = x0 + i * cell
        dr.box(x, 46, cell - 10, 44, tokens[i] if tokens[i].strip() else "␣", f"q_{{{i + 1}}}", SKY, size=16)
        if i:
            dr.arrow((x - 10, 68), (x - 2, 68), width=1.2)
    dr.text(20, 140, "target: one pass over all drafts → p_{1} … p_{γ+1}", 15, anchor="start", weight="600")
    dr.rect(x0, 152, gamma * cell, 40, PURPLE, 0.22, rx=6)
    dr.text(x0 + gamma * cell / 2, 172, f"1 forward pass, {gamma + 1} positions", 14)
    dr.text(20, 240, "verify: keep with probability min(1, p/q)", 15, anchor="start", weight="600")
    for i in range(gamma + 1):
        x = x0 + i * cell
        if i < accepted:
            dr.box(x, 256, cell - 10, 44, "✓ keep", "", GREEN, size=14, fill_opacity=0.35)
        elif i == accepted and accepted < gamma:
            dr.box(x, 256, cell - 10, 44, "✗ reject", "max(0,p−q)", VERMILLION, size=14, fill_opacity=0.3)
        elif i == gamma and accepted == gamma:
            dr.box(x, 256, cell - 10, 44, "+ bonus", "from p_{γ+1}", GREEN, size=14, fill_opacity=0.5)
        elif i < gamma:
            dr.rect(x, 256, cell - 10, 44, INK, 0.05, rx=6, dashed=True)
            dr.text(x + (cell - 10) / 2, 278, "discarded", 13)
    dr.text(W / 2, H - 36, f"emitted this step: {emitted} token{'s' if emitted > 1 else ''} for 1 target pass "
                           f"(at most γ + 1 = {gamma + 1})", 15)
    dr.text(W / 2, H - 12, "each emitted token is distributed exactly as the target's own sample", 13)
    return dr.diagram()


ALL += [mla_compression, ring_pass, speculative_step]


# ----------------------------------------------------------------------------- chapter 10: state space models

def _sup(i: int) -> str:
    """Unicode superscript digits: 12 -> '¹²'."""
    return str(i).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


def zoh_hold(a: float = -1.0, delta: float = 0.5, inputs=(1.0, 0.3, -0.7, 0.9, 0.4)) -> Diagram:
    """Zero-order hold: the input held constant over each step of length Δ, and the state it drives.

    Top: the samples u_k, each held over the step that ends at t_k = kΔ. Bottom: the exact
    solution of h' = a h + u (b = c = 1) under that held input, drawn finely, and its values at
    the step ends, h_k. Because the input is constant over a step, the end of the step follows
    exactly from its start: h_k = Ā h_{k−1} + B̄ u_k with Ā = e^{Δa}, B̄ = (e^{Δa} − 1)/a, the
    numbers printed, taken from :func:`attnlab.ssm.discretize`.
    """
    from .ssm import discretize
    inputs = tuple(float(u) for u in inputs)
    if not (a < 0 and delta > 0 and 2 <= len(inputs) <= 8):
        raise ValueError(f"zoh_hold: needs a < 0, delta > 0 and 2 to 8 inputs, got a={a}, delta={delta}, "
                         f"{len(inputs)} inputs")
    A_bar, B_bar = (v.item() for v in discretize(torch.tensor([a], dtype=torch.float64),
                                                 torch.ones(1, dtype=torch.float64), delta))
    steps, fine = len(inputs), 24
    curve, h, ends = [(0.0, 0.0)], 0.0, []
    for k, u in enumerate(inputs):                 # the exact solution inside step k, from its start h
        for i in range(1, fine + 1):
            s = delta * i / fine
            curve.append((k * delta + s, math.exp(a * s) * h + (math.exp(a * s) - 1) / a * u))
        h = A_bar * h + B_bar * u                  # the recurrence lands on the curve's end
        ends.append(h)
    W, H = 800, 500
    x0, x1 = 70, 500
    px = lambda t: x0 + (x1 - x0) * t / (steps * delta)
    u_max = max(1e-9, max(abs(u) for u in inputs))
    h_max = max(1e-9, max(abs(v) for _, v in curve))
    pu = lambda v: 130 - 70 * v / u_max
    ph = lambda v: 360 - 70 * v / h_max
    dr = Drawing(_name("zoh_hold", a, delta, inputs), W, H,
                 f"Zero-order hold: the input held over each step Δ = {delta:g}",
                 f"Top: {steps} input samples u_1 to u_{steps} = " + ", ".join(f"{u:g}" for u in inputs)
                 + f", each held constant over one step of length Δ = {delta:g}, a staircase. Bottom: the "
                 f"continuous state of h' = a h + u with a = {a:g}, driven by that staircase and drawn exactly; "
                 "it relaxes towards u/|a| within each step. Its values at the step ends are the discrete states "
                 "h_1 to h_" + f"{steps} = " + ", ".join(f"{v:.3f}" for v in ends) + ". Because the input is "
                 f"constant within a step, they follow exactly from h_k = Ā h_(k−1) + B̄ u_k with "
                 f"Ā = e^(Δa) = {A_bar:.3f} and B̄ = (e^(Δa) − 1)/a = {B_bar:.3f}.")
    dr.text(20, 24, "the input, sampled and held: u(t) = u_{k} on (t_{k−1}, t_{k}]", 15, anchor="start",
            weight="700")
    dr.text(20, 250, f"the state, solved exactly under the held input (a = {_minus(f'{a:g}')})", 15,
            anchor="start", weight="700")
    for y in (pu(0), ph(0)):
        dr.line((x0, y), (x1 + 10, y), width=1)
    for k in range(steps + 1):                     # step boundaries t_k
        dr.line((px(k * delta), 56), (px(k * delta), 420), width=0.8, dashed=True)
        dr.text(px(k * delta), 436, f"t_{{{k}}}", 14)
    dr.text((x0 + x1) / 2, 462, f"time t (one step = Δ = {delta:g})", 14)
    for k, u in enumerate(inputs):
        xa, xb = px(k * delta), px((k + 1) * delta)
        dr.rect(min(xa, xb), min(pu(0), pu(u)), xb - xa, abs(pu(u) - pu(0)), ORANGE, 0.25, rx=0, width=0)
        dr.line((xa, pu(u)), (xb, pu(u)), width=2.5, color=ORANGE)
        dr.circle(xb, pu(u), 4, color=ORANGE, fill_opacity=1.0)
        dr.text((xa + xb) / 2, pu(u) + (-13 if u >= 0 else 13), f"u_{{{k + 1}}}", 14)
    dr.line(*[(px(t), ph(v)) for t, v in curve], width=2.5, color=BLUE)
    for k, v in enumerate(ends):
        dr.circle(px((k + 1) * delta), ph(v), 6, color=VERMILLION, fill_opacity=0.9)
        dr.text(px((k + 1) * delta) - 16, ph(v) + (-16 if v >= 0 else 18), f"h_{{{k + 1}}}", 14)
    tx = 540
    dr.rect(tx - 10, 60, 260, 330, INK, 0.04, stroke=INK, rx=8, width=1)
    lines = [("over one step, u is a constant:", "600"),
             ("h(t_{k}) = exp(Δa) · h(t_{k−1})", None),
             ("   + (exp(Δa) − 1)/a · u_{k}", None),
             ("", None),
             ("so the recurrence is exact:", "600"),
             ("h_{k} = Ā h_{k−1} + B̄ u_{k}", None),
             (f"Ā = exp(Δa) = {A_bar:.3f}", None),
             (f"B̄ = (exp(Δa) − 1)/a = {B_bar:.3f}", None),
             ("", None),
             ("blue: the continuous state", None),
             ("red dots: h_{k}, what the model keeps", None),
             ("orange: the held input", None)]
    for i, (s, weight) in enumerate(lines):
        if s:
            dr.text(tx, 84 + i * 25, s, 14, anchor="start", weight=weight)
    return dr.diagram()


def ssm_two_readings(a: float = -0.5, delta: float = 1.0, c: float = 1.0, length: int = 5) -> Diagram:
    """One SSM, two readings: the same graph read along time (a recurrence) and along lags (a convolution).

    Inputs u_t (top) enter states h_t through B̄, states pass on through Ā, outputs y_t read the
    state through C. Read left to right it is the recurrence h_t = Ā h_{t−1} + B̄ u_t. Read from
    one output back to every input, each path from u_s to y_t crosses t − s arrows Ā, so its
    weight is C Ā^{t−s} B̄ = K_{t−s}: the convolution y_t = Σ_k K_k u_{t−k}. The kernel values
    printed come from :func:`attnlab.ssm.ssm_kernel` on :func:`attnlab.ssm.discretize` (ZOH,
    one state, b = 1).
    """
    from .ssm import discretize, ssm_kernel
    if not (isinstance(length, int) and 3 <= length <= 6 and a < 0 and delta > 0):
        raise ValueError(f"ssm_two_readings: needs 3 <= length <= 6, a < 0 and delta > 0, got length={length}, "
                         f"a={a}, delta={delta}")
    A_bar, B_bar = discretize(torch.tensor([[a]], dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64),
                              delta)
    K = ssm_kernel(A_bar, B_bar, torch.tensor([[c]], dtype=torch.float64), length)[0].tolist()
    ab, bb = A_bar.item(), B_bar.item()
    last, src = length - 1, 1                      # the highlighted path: u_1 -> y_{L-1}
    W, H = 800, 520
    gap, x0 = 84, 50
    xs = [x0 + 30 + i * gap for i in range(length)]
    yu, yh, yy = 96, 216, 336
    dr = Drawing(_name("ssm_two_readings", a, delta, c, length), W, H,
                 "One SSM, two readings: a recurrence and a convolution",
                 f"A chain of {length} states h_0 to h_{last}. Each input u_t enters its state through B̄ = {bb:.3f}, "
                 f"each state passes to the next through Ā = {ab:.3f}, each output y_t reads its state through "
                 f"C = {c:g}. Read along time, this is the recurrence h_t = Ā h_(t−1) + B̄ u_t, y_t = C h_t. Read "
                 f"from the output y_{last} back to each input u_s, every path crosses {last} − s arrows Ā, so its "
                 f"weight is C Ā^({last}−s) B̄ = K_({last}−s). The highlighted path from u_{src} crosses "
                 f"{last - src} arrows: weight K_{last - src} = {K[last - src]:.3f}. The kernel K_0 to K_{last} = "
                 + ", ".join(f"{k:.3f}" for k in K) + f" is drawn as bars: y_t = Σ_k K_k u_(t−k).")
    dr.text(20, 24, "reading 1, along time: a recurrence", 16, anchor="start", weight="700")
    dr.text(20, 48, "h_{t} = Ā h_{t−1} + B̄ u_{t},   y_{t} = C h_{t}", 14, anchor="start")
    on_path = lambda t: src <= t <= last
    for t, x in enumerate(xs):
        hot = on_path(t)
        dr.circle(x, yu, 20, f"u_{{{t}}}", color=ORANGE if t == src else INK,
                  fill_opacity=0.3 if t == src else 0.0, size=15)
        dr.arrow((x, yu + 22), (x, yh - 24), color=ORANGE if t == src else INK, width=2.5 if t == src else 1.2)
        dr.rect(x - 26, yh - 22, 52, 44, BLUE, 0.35 if hot else 0.15, rx=6, stroke=INK if hot else None)
        dr.text(x, yh, f"h_{{{t}}}", 15)
        dr.arrow((x, yh + 24), (x, yy - 22), color=ORANGE if t == last else INK,
                 width=2.5 if t == last else 1.2)
        dr.circle(x, yy, 20, f"y_{{{t}}}", color=ORANGE if t == last else INK,
                  fill_opacity=0.3 if t == last else 0.0, size=15)
        if t:
            dr.arrow((xs[t - 1] + 28, yh), (x - 28, yh), color=ORANGE if on_path(t - 1) else INK,
                     width=2.5 if on_path(t - 1) else 1.2)
            dr.text((xs[t - 1] + x) / 2, yh - 14, "Ā", 14)
    dr.text(xs[0] - 16, (yu + yh) / 2, "B̄", 14, anchor="end")
    dr.text(xs[0] - 16, (yh + yy) / 2, "C", 14, anchor="end")
    dr.text(x0, 390, f"u_{{{src}}} reaches y_{{{last}}} across {last - src} arrows Ā:", 14, anchor="start",
            weight="600", color=INK)
    dr.text(x0, 412, f"weight C Ā{_sup(last - src)} B̄ = K_{{{last - src}}} = {_minus(f'{K[last - src]:.3f}')}",
            14, anchor="start")
    # reading 2: the kernel as bars
    bx, base, top = 540, 336, 130
    dr.text(bx - 10, 24, "reading 2, along the lags:", 16, anchor="start", weight="700")
    dr.text(bx - 10, 48, "a convolution, K_{k} = C Āᵏ B̄", 14, anchor="start")
    k_max = max(1e-9, max(abs(k) for k in K))
    bw = 200 / length
    dr.line((bx, base), (bx + 210, base), width=1)
    for k, v in enumerate(K):
        hgt = (base - top) * abs(v) / k_max
        y = base - hgt if v >= 0 else base
        hot = k == last - src
        dr.rect(bx + k * bw + 4, y, bw - 8, hgt, ORANGE if hot else BLUE, 0.45 if hot else 0.25, rx=2)
        dr.text(bx + k * bw + bw / 2, (y - 12) if v >= 0 else (y + hgt + 12), _minus(f"{v:.3f}"), 13)
        dr.text(bx + k * bw + bw / 2, base + 16, f"K_{{{k}}}", 14)
    dr.text(bx + 100, base + 40, "lag k", 14)
    terms = " + ".join(f"K_{{{k}}}u_{{{last - k}}}" for k in range(length))
    dr.text(W / 2, 462, f"the same number both ways: y_{{{last}}} = {terms}", 15, weight="600")
    dr.text(W / 2, 490, "recurrence: one state carried forward (generation); convolution: all y at once (training)",
            14)
    return dr.diagram()


ALL += [zoh_hold, ssm_two_readings]


# ----------------------------------------------------------------------------- chapter 12: hybrids

_MIXER_LOOK = {"A": (VERMILLION, "attention"), "W": (ORANGE, "local attention"), "M": (BLUE, "Mamba"),
               "R": (GREEN, "RG-LRU"), "H": (PURPLE, "Hyena"), "L": (SKY, "linear attention"),
               "C": (YELLOW, "short convolution")}
_FFN_LOOK = {"f": (SKY, "MLP"), "E": (YELLOW, "mixture of experts")}


def layer_stack(pattern=None, name: str = "Jamba-v0.1", per_row: int = 32) -> Diagram:
    """A hybrid's layer stack drawn from its pattern (a list of :class:`attnlab.hybrid.LayerSpec`).

    One column per residual layer, left to right from the input: its sequence mixer on top, its
    feed-forward network below (none: a dashed outline). A Zamba-style ``shared_attention``
    entry is not a layer of its own: it is drawn as an "S" marker over the layer whose input its
    output joins, and every marker stands for a call of the same weights. Rows wrap after
    ``per_row`` layers. The counts in the caption are computed from the pattern.
    """
    from .hybrid import LayerSpec, jamba_pattern, pattern_string

    pattern = jamba_pattern(32) if pattern is None else list(pattern)
    if not pattern or not all(isinstance(s, LayerSpec) for s in pattern):
        raise TypeError("layer_stack: pattern must be a non-empty list of LayerSpec")
    if not (isinstance(per_row, int) and 4 <= per_row <= 40):
        raise ValueError(f"layer_stack: per_row must be an int in [4, 40], got {per_row!r}")
    mixers, ffns = pattern_string(pattern)
    cols, marked = [], set()                        # (mixer letter, ffn letter) per residual layer
    for m, f in zip(mixers, ffns):
        if m == "S":
            marked.add(len(cols))
        else:
            cols.append((m, f))
    if not cols:
        raise ValueError("layer_stack: the pattern has no layer besides shared-block calls")
    n = len(cols)
    per_row = min(per_row, n)
    rows = -(-n // per_row)
    x0, W = 78, 760
    cell = min(52.0, (W - x0 - 12) / per_row)
    band = 128
    top = 58
    H = top + rows * band + 96
    counts = {k: sum(m == k for m, _ in cols) for k in _MIXER_LOOK}
    parts = [f"{c} {_MIXER_LOOK[k][1]}" for k, c in counts.items() if c]
    n_moe = sum(f == "E" for _, f in cols)
    where = {k: [i for i, (m, _) in enumerate(cols) if m == k] for k in _MIXER_LOOK}
    desc = (f"{name}: {n} residual layers, left to right from the input. Mixers: " + "; ".join(
        f"{_MIXER_LOOK[k][1]} at layers {', '.join(map(str, v))}" if len(v) <= 16 else
        f"{_MIXER_LOOK[k][1]} in {len(v)} layers" for k, v in where.items() if v) + ". FFNs: "
        + (f"mixture of experts at layers {', '.join(str(i) for i, (_, f) in enumerate(cols) if f == 'E')}; "
           if n_moe else "") + f"{sum(f == 'f' for _, f in cols)} dense MLPs, "
        f"{sum(f == '·' for _, f in cols)} layers without one."
        + (f" One shared attention + MLP block is called {len(marked)} times, before layers "
           f"{', '.join(map(str, sorted(marked)))}; its output joins those layers' input." if marked else ""))
    dr = Drawing(_name("layer_stack", name, mixers, ffns, per_row), W, H,
                 f"{name}: {n} layers, " + ", ".join(parts), desc)
    dr.text(W / 2, 24, f"{name}: {n} layers", 17, weight="700")
    for r in range(rows):
        y = top + r * band
        dr.text(x0 - 10, y + 36, "mixer", 14, anchor="end")
        dr.text(x0 - 10, y + 78, "FFN", 14, anchor="end")
        for j in range(per_row):
            i = r * per_row + j
            if i >= n:
                break
            m, f = cols[i]
            x = x0 + j * cell
            colour, _ = _MIXER_LOOK[m]
            dr.rect(x + 1.5, y + 18, cell - 3, 36, colour, 0.45 if m in "AW" else 0.3, rx=3)
            dr.text(x + cell / 2, y + 36, m, 14, weight="700" if m in "AW" else None)
            if f == "·":
                dr.rect(x + 1.5, y + 62, cell - 3, 32, INK, 0.0, rx=3, dashed=True, width=1)
            else:
                fc, _ = _FFN_LOOK[f]
                dr.rect(x + 1.5, y + 62, cell - 3, 32, fc, 0.6 if f == "E" else 0.25, rx=3,
                        stroke=INK if f == "E" else None, width=1.2)
                dr.text(x + cell / 2, y + 78, f, 14)
            if i in marked:
                dr.circle(x + cell / 2, y + 4, 9, "S", color=VERMILLION, fill_opacity=0.35, size=13)
                dr.line((x + cell / 2, y + 13), (x + cell / 2, y + 18), color=VERMILLION, width=2)
            step = 1 if cell >= 40 else (4 if cell >= 16 else 8)
            if i % step == 0:
                dr.text(x + cell / 2, y + 108, str(i), 13)
    ly = top + rows * band + 8
    items = [(c, lab) for k, (c, lab) in _MIXER_LOOK.items() if counts[k]]
    items += [(_FFN_LOOK[k][0], _FFN_LOOK[k][1]) for k in "fE" if any(f == k for _, f in cols)]
    lx = x0
    for colour, lab in items:
        dr.rect(lx, ly, 16, 16, colour, 0.45, rx=3)
        dr.text(lx + 22, ly + 8, lab, 14, anchor="start")
        lx += 40 + 8.6 * len(lab)
    if any(f == "·" for _, f in cols):
        dr.rect(lx, ly, 16, 16, INK, 0.0, rx=3, dashed=True, width=1)
        dr.text(lx + 22, ly + 8, "no FFN", 14, anchor="start")
        lx += 40 + 8.6 * 6
    if marked:
        dr.circle(lx + 8, ly + 8, 9, "S", color=VERMILLION, fill_opacity=0.35, size=13)
        dr.text(lx + 24, ly + 8, "shared-block call", 14, anchor="start")
    summary = ", ".join(parts) + (f"; MoE FFN in {n_moe} layers" if n_moe else "") + (
        f"; {len(marked)} calls of one shared block" if marked else "")
    dr.text(W / 2, H - 36, summary, 14)
    dr.text(W / 2, H - 14, "layer index under each column; data flows left to right", 13)
    return dr.diagram()


def zamba_shared_call(n_mamba: int = 76, shared_every: int = 6) -> Diagram:
    """One call site of Zamba's shared block, and where its output goes.

    The residual stream x (left) meets the token embeddings e; the shared block computes
    s = W_l · MLP(RMSNorm(Attn(RMSNorm([x; e])))) with no residual inside it, and s is added to
    the *input* of the next Mamba layer, x + Mamba(RMSNorm(x + s)), never to the stream itself.
    The call sites are :func:`attnlab.hybrid.zamba_shared_layers` of the configuration.
    """
    from .hybrid import zamba_shared_layers

    calls = zamba_shared_layers(n_mamba, shared_every)
    o = 34                                           # everything below the title moves down by o
    W, H = 760, 600 + o
    sx, bx, bw = 110, 300, 230                      # stream x, shared block's left edge and width
    cx = bx + bw / 2
    listed = ", ".join(map(str, calls[:3])) + (f", …, {calls[-1]}" if len(calls) > 3 else "")
    dr = Drawing(_name("zamba_shared_call", n_mamba, shared_every), W, H,
                 f"Zamba's shared block at one call site ({len(calls)} calls in {n_mamba} Mamba layers)",
                 "Data flows upward. The residual stream x and the token embeddings e are concatenated to "
                 "[x; e], 2d wide. The shared block applies RMSNorm, causal attention whose output projection "
                 "returns to width d, RMSNorm and an MLP, with no residual connection inside it. This call "
                 "site's own d × d matrix W_l maps the result to s. s is added to the input of the next Mamba "
                 "layer: the stream becomes x + Mamba(RMSNorm(x + s)); s never joins the stream directly. "
                 f"The same block weights serve all {len(calls)} call sites (before Mamba layers {listed}); "
                 "only W_l differs between them.")
    dr.text(W / 2, 22, f"one call of the shared block (the same weights at all {len(calls)} calls)", 16,
            weight="700")
    # the residual stream
    dr.line((sx, 560 + o), (sx, 112 + o), width=5, color=GREEN)
    dr.arrow((sx, 90 + o), (sx, 46 + o), width=5, color=GREEN)
    _add(dr, sx, 100 + o)
    dr.text(sx, 578 + o, "x (stream, width d)", 14, italic=True)
    dr.text(sx - 14, 330 + o, "residual stream", 14, anchor="end", color=GREEN, weight="600", rotate=-90)
    dr.text(sx + 12, 34 + o, "x + Mamba(RMSNorm(x + s))", 14, italic=True, anchor="start")
    # inputs of the shared block
    dr.line((sx, 520 + o), (cx - 50, 520 + o))
    dr.arrow((cx - 50, 520 + o), (cx - 50, 486 + o))
    dr.text(cx + 150, 560 + o, "e: token embeddings", 14, anchor="middle", italic=True)
    dr.text(cx + 150, 578 + o, "(the model's input, kept)", 13, anchor="middle")
    dr.line((cx + 150, 546 + o), (cx + 150, 520 + o), (cx + 50, 520 + o))
    dr.arrow((cx + 50, 520 + o), (cx + 50, 486 + o))
    # the shared block, bottom to top
    dr.rect(bx - 14, 204 + o, bw + 28, 292, INK, 0.0, rx=10, dashed=True)
    dr.text(bx + bw + 22, 232 + o, "shared", 14, anchor="start", weight="700")
    dr.text(bx + bw + 22, 250 + o, "block", 14, anchor="start", weight="700")
    boxes = [(448, 36, "concat [x; e]", "width 2d", SKY), (396, 32, "RMSNorm (2d)", "", PURPLE),
             (334, 44, "causal attention", "q, k, v from 2d; out → d", VERMILLION),
             (282, 32, "RMSNorm (d)", "", PURPLE), (212, 54, "MLP", "d → d_{ff} → d", ORANGE)]
    for i, (y, h, label, sub, colour) in enumerate(boxes):
        dr.box(bx, y + o, bw, h, label, sub, colour, size=14)
        if i:
            dr.arrow((cx, boxes[i - 1][0] + o), (cx, y + h + o))
    dr.text(bx + bw + 22, 300 + o, "no residual", 13, anchor="start")
    dr.text(bx + bw + 22, 318 + o, "inside", 13, anchor="start")
    # this call site's own projection
    dr.arrow((cx, 212 + o), (cx, 196 + o))
    dr.box(bx + 30, 160 + o, bw - 60, 36, "W_{l}: this call's own", "", BLUE, size=14, fill_opacity=0.35)
    dr.arrow((cx, 160 + o), (cx, 140 + o), (238, 140 + o), label="s", label_at=(cx - 60, 128 + o))
    # the Mamba layer that receives s
    dr.line((sx, 420 + o), (226, 420 + o), (226, 154 + o))
    _add(dr, 226, 140 + o)
    dr.text(236, 164 + o, "x + s", 13, anchor="start")
    dr.arrow((226, 127 + o), (226, 120 + o))
    dr.box(176, 84 + o, 100, 36, "RMSNorm", "", PURPLE, size=14)
    dr.arrow((226, 84 + o), (226, 74 + o))
    dr.box(176, 40 + o, 100, 34, "Mamba", "", BLUE, size=14, fill_opacity=0.35)
    dr.arrow((176, 57 + o), (sx + 30, 57 + o), (sx + 30, 100 + o), (sx + 14, 100 + o))
    dr.text(W - 16, 84 + o, f"call sites: before Mamba layers {listed}", 13, anchor="end")
    dr.text(W - 16, 104 + o, f"(Zamba-7B-v1: {n_mamba} layers, period {shared_every})", 13, anchor="end")
    return dr.diagram()


ALL += [layer_stack, zamba_shared_call]


# ----------------------------------------------------------------------------- chapter 11: Mamba

def mamba_block(d_model: int = 768, d_state: int = 16, d_conv: int = 4, expand: int = 2) -> Diagram:
    """The Mamba block (Gu and Dao 2023, Figure 3), data flowing upward, with its parameter counts.

    in_proj splits the input into the main branch x and the gate branch z. x passes a causal
    depthwise convolution and SiLU, then the selective SSM, whose Δ_t, B_t and C_t are computed
    from x itself (x_proj, dt_proj, softplus); z passes SiLU; the two are multiplied and out_proj
    maps back to d_model. Every count is read off :class:`attnlab.ssm.Mamba` built on the meta
    device for these sizes.
    """
    from .ssm import Mamba, MambaConfig

    config = MambaConfig(d_model=int(d_model), d_state=int(d_state), d_conv=int(d_conv), expand=int(expand))
    with torch.device("meta"):
        m = Mamba(config)
    count = lambda *ps: sum(p.numel() for p in ps)                        # noqa: E731
    c, di, R = config, config.d_inner, config.rank
    parts = {"in_proj": count(*m.in_proj.parameters()), "conv1d": count(*m.conv1d.parameters()),
             "x_proj": count(*m.x_proj.parameters()), "dt_proj": count(*m.dt_proj.parameters()),
             "A_log, D": count(m.A_log, m.D), "out_proj": count(*m.out_proj.parameters())}
    total = count(*m.parameters())
    W, H = 840, 660
    dr = Drawing(_name("mamba_block", c.d_model, c.d_state, c.d_conv, c.expand), W, H,
                 f"The Mamba block (d_model = {c.d_model}, d_inner = {di}, n = {c.d_state})",
                 f"Data flows upward. The input u of width {c.d_model} enters in_proj, which produces two streams "
                 f"of width {di}: x on the left and the gate z on the right. x passes a causal depthwise "
                 f"convolution of width {c.d_conv} and a SiLU, then the selective SSM. From the same x, x_proj "
                 f"computes a low-rank δ (rank {R}) and B_t, C_t ({c.d_state} numbers each), and dt_proj with a "
                 f"softplus turns δ into the step size Δ_t of every channel; Δ_t, B_t and C_t enter the SSM, "
                 f"which runs h_t = exp(Δ_t A) h_(t−1) + Δ_t B_t x_t and y_t = C_t·h_t + D x_t. z passes a SiLU. "
                 f"The SSM output and SiLU(z) are multiplied elementwise and out_proj maps the product back to "
                 f"width {c.d_model}. Parameters: " + ", ".join(f"{k} {v:,}" for k, v in parts.items())
                 + f"; total {total:,}.")
    mx, gx, bw = 340, 570, 170                         # the main branch, the gate branch
    dr.text(mx, 630, f"u  (b, L, {c.d_model})", 15, italic=True)
    dr.arrow((mx, 614), (mx, 590))
    dr.box(mx - 110, 548, gx - mx + 220, 40, "in_proj", f"{c.d_model} → 2 × {di}", BLUE)
    # main branch, bottom to top
    dr.arrow((mx, 548), (mx, 520), label="x", label_at=(mx - 14, 532))
    dr.box(mx - bw / 2, 478, bw, 40, "conv1d, causal", f"width {c.d_conv}, per channel", SKY)
    dr.arrow((mx, 478), (mx, 452))
    dr.box(mx - bw / 2, 418, bw, 32, "SiLU", color=GREEN)
    dr.arrow((mx, 418), (mx, 318))
    # the selection branch, to the left: Δ_t, B_t, C_t computed from x itself
    sx, sw = 24, 176
    dr.line((mx, 400), (sx + sw / 2, 400), (sx + sw / 2, 372))
    dr.arrow((sx + sw / 2, 373), (sx + sw / 2, 370))
    dr.box(sx, 324, sw, 46, "x_proj", f"{di} → {R} + 2 × {c.d_state}", PURPLE)
    dr.arrow((sx + sw / 2, 324), (sx + sw / 2, 262), label="δ", label_at=(sx + sw / 2 + 12, 294))
    dr.box(sx, 218, sw, 42, "dt_proj, softplus", f"δ → Δ_{{t}}  ({di})", PURPLE)
    ssm_x = mx - 100
    dr.arrow((sx + sw, 239), (ssm_x - 2, 239), color=ORANGE, width=2)
    dr.text((sx + sw + ssm_x) / 2, 226, "Δ_{t}", 14, color=ORANGE, weight="600")
    dr.arrow((sx + sw, 347), (sx + sw + 16, 347), (sx + sw + 16, 296), (ssm_x - 2, 296), color=ORANGE, width=2)
    dr.text(sx + sw + 22, 330, "B_{t}, C_{t}", 14, anchor="start", color=ORANGE, weight="600")
    dr.rect(ssm_x, 196, 200, 120, ORANGE, 0.16, rx=8)
    dr.text(mx, 214, "selective SSM", 15, weight="700")
    dr.text(mx, 240, "h_{t} = exp(Δ_{t}A) h_{t−1}", 14)
    dr.text(mx, 260, "+ Δ_{t} B_{t} x_{t}", 14)
    dr.text(mx, 282, "y_{t} = C_{t}·h_{t} + D x_{t}", 14)
    dr.text(mx, 304, f"state: {di} × {c.d_state}", 13)
    dr.arrow((mx, 196), (mx, 142))
    # gate branch
    dr.arrow((gx, 548), (gx, 452), label="z", label_at=(gx + 14, 500))
    dr.box(gx - 60, 418, 120, 32, "SiLU", color=GREEN)
    dr.arrow((gx, 418), (gx, 128), (mx + 16, 128))
    dr.text(gx - 10, 280, "the gate", 14, anchor="end", italic=True)
    # multiply and out_proj
    dr.circle(mx, 128, 14, width=2)
    dr.text(mx, 128, "×", 18)
    dr.arrow((mx, 114), (mx, 92))
    dr.box(mx - bw / 2, 50, bw, 40, "out_proj", f"{di} → {c.d_model}", BLUE)
    dr.arrow((mx, 50), (mx, 30))
    dr.text(mx, 18, f"out  (b, L, {c.d_model})", 15, italic=True)
    # parameter table on the right
    tx = 640
    dr.text(tx, 56, "parameters", 15, anchor="start", weight="700")
    for k, (name, v) in enumerate(parts.items()):
        dr.text(tx, 84 + 24 * k, name, 14, anchor="start")
        dr.text(W - 16, 84 + 24 * k, f"{v:,}", 14, anchor="end")
    dr.line((tx, 84 + 24 * len(parts) - 10), (W - 16, 84 + 24 * len(parts) - 10), width=1)
    dr.text(tx, 84 + 24 * len(parts) + 6, "total", 14, anchor="start", weight="600")
    dr.text(W - 16, 84 + 24 * len(parts) + 6, f"{total:,}", 14, anchor="end", weight="600")
    dr.text(tx, 84 + 24 * len(parts) + 32, f"= {total / c.d_model ** 2:.2f} d_{{model}}²", 14, anchor="start")
    return dr.diagram()


def selective_scan_flow(tokens=("7", "·", "·", "3", "·", "·"), deltas=(2.0, 0.01, 0.01, 2.0, 0.01, 0.01),
                        A: float = -1.0) -> Diagram:
    """The selective scan as a state flowing through time, one column per token.

    Each token x_t computes its own Δ_t, B_t, C_t; the state h_(t−1) is multiplied by the decay
    ā_t = exp(Δ_t A) (printed, for the diagonal entry ``A``), Δ_t B_t x_t is added, and
    y_t = C_t·h_t is read out. Large Δ_t: ā_t near 0, the old state is replaced by the token;
    Δ_t near 0: ā_t near 1 and nothing is written, the token passes by.
    """
    tokens, deltas = tuple(str(t) for t in tokens), tuple(float(v) for v in deltas)
    if len(tokens) != len(deltas) or not 1 <= len(tokens) <= 8 or min(deltas) < 0 or A > 0:
        raise ValueError(f"selective_scan_flow: needs 1 to 8 tokens with as many deltas >= 0 and A <= 0, "
                         f"got {len(tokens)} tokens, {len(deltas)} deltas, A = {A}")
    decays = torch.exp(torch.tensor(deltas, dtype=torch.float64) * A).tolist()
    T, step, x0 = len(tokens), 108, 170
    W, H = max(640, x0 + T * step + 20), 520
    dr = Drawing(_name("selective_scan_flow", tokens, deltas, A), W, H,
                 f"The selective scan over {T} tokens",
                 f"One column per token, t = 0 to {T - 1}, time running left to right, from the state h_(−1) = 0. "
                 f"Each token x_t computes its own step size "
                 f"Δ_t and its B_t and C_t. The state h moves along the middle row: from h_(t−1) to h_t it is "
                 f"multiplied by the decay exp(Δ_t A) (A = {A:g}), and Δ_t B_t x_t is added; y_t = C_t·h_t is "
                 f"read out above. Tokens and decays: "
                 + ", ".join(f"{t!r} Δ = {d:g}, decay {a:.2f}" for t, d, a in zip(tokens, deltas, decays))
                 + ". A large Δ resets the state to the token (decay near 0); a Δ near 0 keeps the state and "
                   "writes nothing (decay near 1).")
    ys, yh, yp, yx = 70, 220, 340, 440
    dr.text(20, ys, "read", 14, anchor="start", weight="600")
    dr.text(20, yh, "state", 14, anchor="start", weight="600")
    dr.text(20, yp, "selection", 14, anchor="start", weight="600")
    dr.text(20, yx, "token", 14, anchor="start", weight="600")
    dr.circle(x0 + 40 - step, yh, 20, "h_{−1}", size=14, dashed=True)          # h_(−1) = 0, t counts from 0
    for t, (tok, d, a) in enumerate(zip(tokens, deltas, decays)):
        cx = x0 + 40 + t * step
        hot = a < 0.5
        color = ORANGE if hot else BLUE
        dr.box(cx - 30, yx - 20, 60, 40, tok, color=color, size=16, fill_opacity=0.35 if hot else 0.12)
        dr.arrow((cx, yx - 20), (cx, yp + 26))
        dr.box(cx - 44, yp - 24, 88, 48, f"Δ = {d:g}", "B_{t}, C_{t}", color, size=14)
        dr.arrow((cx, yp - 24), (cx, yh + 22), color=color, width=3 if hot else 1.2, dashed=not hot)
        dr.text(cx + 6, yh + 54, "+Δ_{t}B_{t}x_{t}", 13, anchor="start", color=INK)
        dr.circle(cx, yh, 20, f"h_{{{t}}}", color=color, fill_opacity=0.3 if hot else 0.08, size=14)
        prev = cx - step
        dr.arrow((prev + 22, yh), (cx - 22, yh), width=1.2 if hot else 3, color=INK)
        dr.text((prev + cx) / 2 + 2, yh - 16, f"× {a:.2f}", 13)
        dr.arrow((cx, yh - 20), (cx, ys + 18))
        dr.text(cx, ys, f"y_{{{t}}}", 15)
        dr.text(cx + 6, (ys + yh) / 2, "C_{t}·h_{t}", 13, anchor="start")
    dr.text(W / 2, H - 44, "orange: Δ large, the decay exp(ΔA) near 0: the old state is replaced by this token",
            14, color=INK)
    dr.text(W / 2, H - 20, "blue: Δ near 0, the decay near 1 and nothing written: the state carries on past it",
            14, color=INK)
    return dr.diagram()


ALL += [mamba_block, selective_scan_flow]


# ----------------------------------------------------------------------------- chapter 12: algorithms

def _times(dr: Drawing, x, y, r=14):
    """A ⊙ node: elementwise product."""
    dr.circle(x, y, r, width=2)
    dr.text(x, y, "⊙", 18)


def griffin_block(d_model: int = 2560, d_rnn: int | None = None, conv_width: int = 4) -> Diagram:
    """Griffin's recurrent block (De et al. 2024, Figure 2), data flowing upward.

    The input x feeds two branches: a gate branch, Linear W_1 then GeLU, and a recurrent branch,
    Linear W_2, a causal depthwise Conv1D and the RG-LRU. The two are multiplied elementwise and
    W_out maps the product back to d_model. The state a sequence keeps while decoding is read off
    :class:`attnlab.rglru.GriffinRecurrentBlock` built on the meta device for these sizes.
    """
    from .rglru import GriffinRecurrentBlock

    _check_sizes = [("d_model", d_model), ("conv_width", conv_width)] + ([("d_rnn", d_rnn)] if d_rnn is not None else [])
    for name, v in _check_sizes:
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"griffin_block: {name} must be a positive int, got {v!r}")
    with torch.device("meta"):
        block = GriffinRecurrentBlock(d_model, d_rnn, conv_width)
    dr_, state = block.d_rnn, block.state_size()
    W, H = 760, 640
    dr = Drawing(_name("griffin_block", d_model, dr_, conv_width), W, H,
                 f"Griffin's recurrent block (d_model = {d_model}, d_rnn = {dr_})",
                 f"Data flows upward. The input x (width {d_model}) feeds two branches. Left, the gate branch: "
                 f"a linear map W_1 to width {dr_} and a GeLU. Right, the recurrent branch: a linear map W_2 to width "
                 f"{dr_}, a causal depthwise Conv1D of width {conv_width}, and the RG-LRU, whose gates r_t and i_t are "
                 "computed from its own input u_t and whose decay is a_t = σ(Λ)^(c r_t) with c = 8; it updates "
                 "h_t = a_t h_(t−1) + √(1 − a_t²)(i_t u_t). The two branches are multiplied elementwise and W_out "
                 f"maps the product back to width {d_model}. While decoding, a sequence keeps {dr_:,} numbers of "
                 f"h and {dr_ * (conv_width - 1):,} of convolution inputs: {state:,} in all, whatever its length.")
    cx, gx, rx = 380, 200, 545
    dr.text(W / 2, 22, "Griffin's recurrent block", 17, weight="700")
    dr.text(cx, 578, f"x  (b, L, {d_model})", 15, italic=True)
    dr.line((cx, 562), (cx, 532))
    dr.line((gx, 532), (rx, 532))
    dr.arrow((gx, 532), (gx, 498))
    dr.arrow((rx, 532), (rx, 498))
    # gate branch
    dr.box(gx - 70, 462, 140, 36, "Linear W_{1}", color=BLUE, size=15)
    dr.arrow((gx, 462), (gx, 426))
    dr.box(gx - 70, 392, 140, 34, "GeLU", color=GREEN, size=15)
    dr.arrow((gx, 392), (gx, 180), (cx - 16, 180))
    dr.text(gx - 12, 300, "gate branch", 14, anchor="end", italic=True)
    # recurrent branch
    dr.box(rx - 80, 462, 160, 36, "Linear W_{2}", color=BLUE, size=15)
    dr.arrow((rx, 462), (rx, 432))
    dr.box(rx - 110, 390, 220, 42, "Conv1D, causal", f"width {conv_width}, per channel", SKY, size=15)
    dr.arrow((rx, 390), (rx, 356), label="u_{t}", label_at=(rx + 18, 372))
    dr.rect(rx - 185, 232, 370, 124, ORANGE, 0.16, rx=8)
    dr.text(rx, 250, "RG-LRU", 15, weight="700")
    dr.text(rx, 276, "r_{t} = σ(W_{a}u_{t} + b_{a}),  i_{t} = σ(W_{x}u_{t} + b_{x})", 14)
    dr.text(rx, 300, "a_{t} = σ(Λ)^(c·r_{t}),  c = 8", 14)
    dr.text(rx, 324, "h_{t} = a_{t} h_{t−1} + √(1 − a_{t}²) (i_{t} u_{t})", 14)
    dr.text(rx, 344, f"state: {dr_:,} numbers (one per channel)", 13)
    dr.arrow((rx, 232), (rx, 180), (cx + 16, 180))
    dr.text(rx + 100, 480, "recurrent\nbranch", 14, anchor="start", italic=True)
    dr.text(rx + 12, 204, "h_{t}", 14, anchor="start")
    _times(dr, cx, 180)
    dr.arrow((cx, 166), (cx, 142))
    dr.box(cx - 80, 106, 160, 36, "Linear W_{out}", color=BLUE, size=15)
    dr.arrow((cx, 106), (cx, 70))
    dr.text(cx, 56, f"y  (b, L, {d_model})", 15, italic=True)
    dr.text(W / 2, H - 36, f"decoding state per sequence: {dr_:,} (h) + {dr_ * (conv_width - 1):,} (conv inputs) "
                           f"= {state:,} numbers, at any length", 14)
    dr.text(W / 2, H - 14, "the block sits in a pre-norm residual layer: x ← x + block(RMSNorm(x))", 13)
    return dr.diagram()


def hyena_operator(d_model: int = 4096, short_filter: int = 3, filter_state: int = 2) -> Diagram:
    """The Hyena operator of order 2 (Poli et al. 2023) as StripedHyena uses it, data flowing upward.

    in_proj maps u to three streams, a short causal convolution filters each, and
    y = x² ⊙ (h * (x¹ ⊙ v) + D ⊙ x¹ ⊙ v): two gates around one long causal convolution, whose
    filter is modal, h_t = Σ_k R_k λ_k^t. The decoding state is read off
    :class:`attnlab.hyena.HyenaOperator` built on the meta device for these sizes.
    """
    from .hyena import HyenaOperator

    for name, v in (("d_model", d_model), ("short_filter", short_filter), ("filter_state", filter_state)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"hyena_operator: {name} must be a positive int, got {v!r}")
    with torch.device("meta"):
        op = HyenaOperator(d_model, short_filter, filter_state)
    state = op.state_size()
    W, H = 760, 680
    dr = Drawing(_name("hyena_operator", d_model, short_filter, filter_state), W, H,
                 f"The Hyena operator of order 2 (d = {d_model}, {filter_state} modes per filter)",
                 f"Data flows upward. The input u (width {d_model}) is projected to three streams of width "
                 f"{d_model} and each is filtered by a short causal convolution of length {short_filter}: v, x1 "
                 "and x2. z = x1 ⊙ v is passed through one long causal convolution h * z, whose filter is modal, "
                 f"h_t = Σ_k R_k λ_k^t with {filter_state} modes per channel, so it can run as an FFT in "
                 "O(N log N), as a direct sum in O(N²), or as a recurrence with one number per mode. D ⊙ z is added, "
                 "the sum is gated by x2, and out_proj maps it back. While decoding, a sequence keeps "
                 f"{state:,} numbers: {d_model * filter_state:,} modes and {3 * d_model * (short_filter - 1):,} "
                 "short-convolution inputs.")
    cx, vx, x1x, x2x, zx = 380, 230, 380, 600, 305
    dr.text(W / 2, 22, "The Hyena operator (order 2)", 17, weight="700")
    dr.text(cx, 652, f"u  (b, L, {d_model})", 15, italic=True)
    dr.arrow((cx, 636), (cx, 612))
    dr.box(cx - 150, 576, 300, 36, "in_proj W_{in}", f"{d_model} → 3 × {d_model}", BLUE, size=15)
    dr.arrow((cx, 576), (cx, 552))
    dr.box(cx - 150, 510, 300, 42, "short conv, causal", f"length {short_filter}, per channel", SKY, size=15)
    dr.line((cx, 510), (cx, 492))
    dr.line((vx, 492), (x2x, 492))
    for x, lab in ((vx, "v"), (x1x, "x¹"), (x2x, "x²")):
        dr.text(x + 14, 478, lab, 15, anchor="start", italic=True)
    dr.line((vx, 492), (vx, 430))
    dr.arrow((vx, 430), (zx - 16, 430))
    dr.line((x1x, 492), (x1x, 430))
    dr.arrow((x1x, 430), (zx + 16, 430))
    _times(dr, zx, 430)
    dr.arrow((zx, 416), (zx, 352), label="z", label_at=(zx + 14, 392))
    dr.rect(zx - 150, 250, 300, 102, ORANGE, 0.16, rx=8)
    dr.text(zx, 270, "long convolution h * z", 15, weight="700")
    dr.text(zx, 296, "h_{t} = Σ_{k} R_{k} λ_{k}ᵗ", 14)
    dr.text(zx, 318, f"{filter_state} modes per channel", 13)
    dr.text(zx, 338, "FFT O(N log N) · direct O(N²) · recurrent", 13)
    # D skip
    dr.line((zx, 392), (110, 392), (110, 330))
    dr.box(70, 290, 80, 40, "D ⊙", color=PURPLE, size=15)
    dr.arrow((110, 290), (110, 200), (zx - 14, 200))
    dr.arrow((zx, 250), (zx, 214))
    _add(dr, zx, 200)
    dr.arrow((zx, 186), (zx, 164))
    dr.line((x2x, 492), (x2x, 150))
    dr.arrow((x2x, 150), (zx + 16, 150))
    dr.text(x2x + 12, 320, "the gate x²", 14, anchor="start", italic=True)
    _times(dr, zx, 150)
    dr.arrow((zx, 136), (zx, 114))
    dr.box(zx - 80, 78, 160, 36, "out_proj", color=BLUE, size=15)
    dr.arrow((zx, 78), (zx, 60))
    dr.text(zx, 46, f"y  (b, L, {d_model})", 15, italic=True)
    dr.text(W - 16, 96, f"decoding state: {state:,} numbers", 14, anchor="end")
    dr.text(W - 16, 116, f"= {d_model:,} × {filter_state} modes", 13, anchor="end")
    dr.text(W - 16, 134, f"+ 3 × {d_model:,} × {short_filter - 1} conv inputs", 13, anchor="end")
    return dr.diagram()


def moe_router(n_experts: int = 8, top_k: int = 2, logits=None) -> Diagram:
    """A top-k mixture-of-experts layer for one token, data flowing upward.

    The router computes p = softmax(x W_g) over the E experts (the bars, probabilities printed),
    keeps the k largest, runs only those experts and adds their outputs weighted by p_i. The
    Switch balancing loss is stated beside it. ``logits`` (E numbers) default to a fixed
    deterministic pattern; the probabilities are computed with torch.
    """
    if not isinstance(n_experts, int) or not 2 <= n_experts <= 16:
        raise ValueError(f"moe_router: n_experts must be an int in [2, 16], got {n_experts!r}")
    if not isinstance(top_k, int) or not 1 <= top_k <= n_experts:
        raise ValueError(f"moe_router: top_k must be an int in [1, n_experts={n_experts}], got {top_k!r}")
    if logits is None:
        logits = [round(1.4 * math.sin(2.3 * i + 1.0), 3) for i in range(n_experts)]
    logits = [float(v) for v in logits]
    if len(logits) != n_experts:
        raise ValueError(f"moe_router: logits must hold n_experts={n_experts} numbers, got {len(logits)}")
    p = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
    chosen = sorted(p.topk(top_k).indices.tolist())
    probs = [round(v, 2) for v in p.tolist()]
    E, W, H = n_experts, 760, 636
    dr = Drawing(_name("moe_router", E, top_k, tuple(logits)), W, H,
                 f"A top-{top_k} mixture-of-experts layer with {E} experts, for one token",
                 f"Data flows upward. A token x enters the router, p = softmax(x W_g) over {E} experts. The bars show "
                 "p: " + ", ".join(f"expert {i + 1} {v:.2f}" for i, v in enumerate(probs)) + f". The {top_k} largest "
                 f"(experts {', '.join(str(i + 1) for i in chosen)}) are kept; only those experts run on x, and their "
                 "outputs are added weighted by their probabilities, not renormalised: y = Σ over the top-k of "
                 f"p_i FFN_i(x). The other {E - top_k} experts do not run for this token. Per token the layer costs "
                 f"{top_k} FFNs and holds {E}. Over a batch, the Switch balancing loss α E Σ_i f_i P_i uses f_i, the "
                 "share of routing slots sent to expert i, and P_i, its mean router probability.")
    x0, x1 = 70, W - 30
    cw = (x1 - x0) / E
    dr.text(W / 2, 22, f"Top-{top_k} routing over {E} experts (one token)", 17, weight="700")
    dr.text(W / 2, 578, "x  (one token, width d)", 15, italic=True)
    dr.arrow((W / 2, 562), (W / 2, 538))
    dr.box(W / 2 - 150, 500, 300, 38, "router: p = softmax(x W_{g})", f"W_{{g}}: d × {E}", PURPLE, size=15)
    base, top = 462, 360
    dr.line((x0, base), (x1, base), width=1)
    dr.arrow((W / 2, 500), (W / 2, base + 2))
    dr.text(x0 - 8, (base + top) / 2, "p", 15, anchor="end", italic=True)
    pmax = max(probs) or 1.0
    for i, v in enumerate(probs):
        bx = x0 + i * cw
        hot = i in chosen
        h = (base - top) * v / pmax
        dr.rect(bx + cw * 0.2, base - h, cw * 0.6, h, ORANGE if hot else BLUE, 0.6 if hot else 0.18, rx=2)
        dr.text(bx + cw / 2, base - h - 12, f"{v:.2f}", 13, weight="700" if hot else None)
        dr.text(bx + cw / 2, base + 14, str(i + 1), 13)
    # experts
    ey, eh = 232, 44
    for i in range(E):
        bx = x0 + i * cw
        hot = i in chosen
        if hot:
            dr.rect(bx + 3, ey, cw - 6, eh, ORANGE, 0.35, rx=5)
            y_bar = base - (base - top) * probs[i] / pmax - 24
            dr.arrow((bx + cw / 2, y_bar), (bx + cw / 2, ey + eh), color=ORANGE, width=2.5)
            dr.text(bx + cw / 2 + 6, (y_bar + ey + eh) / 2, f"× p{_sub(i + 1)}", 14, anchor="start")
        else:
            with dr.group(opacity=0.45):
                dr.rect(bx + 3, ey, cw - 6, eh, INK, 0.0, rx=5, dashed=True, width=1)
        dr.text(bx + cw / 2, ey + eh / 2, f"FFN{_sub(i + 1)}", 14 if cw >= 60 else 13)
    sx, sy = W / 2, 150
    for i in chosen:
        dr.arrow((x0 + i * cw + cw / 2, ey), (sx + (12 if x0 + i * cw + cw / 2 > sx else -12), sy + 8),
                 color=ORANGE, width=2)
    _add(dr, sx, sy)
    dr.arrow((sx, sy - 14), (sx, 104))
    dr.text(sx, 88, "y = Σ_{i ∈ top-k} p_{i} FFN_{i}(x)", 15)
    dr.text(W / 2, 616, f"this token runs {top_k} of {E} experts: the compute of {top_k} FFNs, the parameters of {E}",
            14)
    dr.text(W / 2, 50, "over a batch: L_{aux} = α E Σ_{i} f_{i} P_{i}   (f_{i}: share of slots, P_{i}: mean p_{i})",
            14)
    return dr.diagram()


ALL += [griffin_block, hyena_operator, moe_router]


# ----------------------------------------------------------------------------- chapter 11: the parallel scan

def parallel_scan(length: int = 8) -> Diagram:
    """The Hillis–Steele scan of h_t = a_t h_(t−1) + x_t over ``length`` steps, data flowing upward.

    Step t is the pair (a_t, x_t), the map h ↦ a_t h + x_t. At the level with offset d = 1, 2, 4, …
    every node t ≥ d combines the node t − d below it with its own: (a₁, x₁) ∘ (a₂, x₂) =
    (a₁a₂, a₂x₁ + x₂). A node is labelled with the steps its map covers; after ⌈log₂ L⌉ levels
    every node covers 0…t, and its x is h_t. The orange edges are the combines, all of one level
    independent of each other: L log₂ L-order work in log₂ L parallel steps, against L − 1
    combines one after another for the loop.
    """
    if not isinstance(length, int) or isinstance(length, bool) or not 2 <= length <= 16:
        raise ValueError(f"parallel_scan: length must be an int in [2, 16], got {length!r}")
    L = length
    offsets = [2 ** k for k in range(max(1, math.ceil(math.log2(L))))]
    offsets = [d for d in offsets if d < L]
    combines = sum(L - d for d in offsets)
    W, row = 780, 92
    H = 150 + row * len(offsets) + 70
    dr = Drawing(_name("parallel_scan", L), W, H,
                 f"A parallel (Hillis–Steele) scan over {L} steps: {len(offsets)} levels, {combines} combines",
                 f"Data flows upward. The bottom row holds the {L} steps t = 0 to {L - 1}, each the pair (a_t, x_t), "
                 f"the map h to a_t h + x_t. At each level, with offsets " + ", ".join(str(d) for d in offsets)
                 + ", every node t at least the offset combines the node offset steps to its left, one level "
                 "down, with its own node, by (a1, x1) then (a2, x2) = (a1 a2, a2 x1 + x2). Nodes are labelled "
                 "with the steps their map covers. After the last level every node t covers steps 0 to t and "
                 f"holds h_t. All combines of a level are independent: {len(offsets)} parallel steps and "
                 f"{combines} combines, against {L - 1} combines one after another in a loop.")
    x0, x1 = 130, W - 30
    col = (x1 - x0) / L
    xs = [x0 + col * (t + 0.5) for t in range(L)]
    y_of = lambda level: H - 90 - level * row                                   # noqa: E731
    lo = list(range(L))                                                         # node t covers lo[t] … t
    r = min(22, col * 0.42)

    def node(t, level, label):
        done = lo[t] == 0 and level > 0
        dr.circle(xs[t], y_of(level), r, color=GREEN if done else BLUE, fill_opacity=0.3 if done else 0.12)
        dr.text(xs[t], y_of(level), label, 13 if len(label) > 2 else 14)

    def span(t):
        return str(t) if lo[t] == t else f"{lo[t]}–{t}"

    dr.text(20, y_of(0), "steps", 14, anchor="start", weight="600")
    dr.text(20, y_of(0) + 24, "(a_{t}, x_{t})", 13, anchor="start")
    for t in range(L):
        node(t, 0, str(t))
    for level, d in enumerate(offsets, 1):
        y, y_prev = y_of(level), y_of(level - 1)
        dr.text(20, y, f"offset {d}", 14, anchor="start", weight="600")
        new_lo = lo[:]
        for t in range(L):
            dr.line((xs[t], y_prev - r), (xs[t], y + r), width=1.2, dashed=t < d)
            if t >= d:
                dr.line((xs[t - d], y_prev - r), (xs[t] - r * 0.6, y + r * 0.8), width=2, color=ORANGE)
                new_lo[t] = lo[t - d]
        lo = new_lo
        for t in range(L):
            node(t, level, span(t))
    top = y_of(len(offsets))
    for t in range(L):
        dr.arrow((xs[t], top - r), (xs[t], top - r - 22))
        dr.text(xs[t], top - r - 36, f"h_{{{t}}}", 15)
    dr.text(W / 2, 22, "orange edge: one combine, (a₁, x₁) ∘ (a₂, x₂) = (a₁a₂, a₂x₁ + x₂); "
            "green node: covers 0…t, so it holds h_{t}", 14)
    dr.text(W / 2, H - 28, f"{len(offsets)} levels of independent combines ({combines} in all) "
            f"instead of {L - 1} combines one after another", 14)
    return dr.diagram()


ALL += [parallel_scan]


# ----------------------------------------------------------------------------- chapter 13: the recall lab

def mqar_prompt(n_pairs: int = 4, seq_len: int = 24, vocab: int = 64, seed: int = 2) -> Diagram:
    """One of Zoology's MQAR prompts, drawn from :func:`attnlab.tasks.mqar_zoology` (power-law gaps).

    The row holds the prompt's tokens: the pairs k v (keys blue, values orange), then the tail,
    whose even offsets are the gap slots g1, g2, …; pair j's key is asked again in slot g_j
    (green outline) and every other tail token is random filler (grey, dashed; it may repeat a
    key and asks nothing). Under each query sits its target, the value bound to its key, and an
    arc joins the query to that value: the lookup a model must make.
    """
    from .tasks import mqar_zoology

    if not (isinstance(n_pairs, int) and isinstance(seq_len, int) and isinstance(vocab, int)
            and 1 <= n_pairs <= 8 and seq_len % 2 == 0 and 4 * n_pairs <= seq_len <= 32
            and 2 * n_pairs + 2 <= vocab <= 100):
        raise ValueError(f"mqar_prompt: needs 1 <= n_pairs <= 8, seq_len even in [4 n_pairs, 32] and "
                         f"2 n_pairs + 2 <= vocab <= 100, got n_pairs={n_pairs!r}, seq_len={seq_len!r}, "
                         f"vocab={vocab!r}")
    batch = mqar_zoology(1, n_pairs, seq_len, vocab=vocab, seed=seed)
    tokens, targets = batch.inputs[0].tolist(), batch.targets[0].tolist()
    gaps = batch.gaps[0].tolist()
    P, L = n_pairs, seq_len
    asked = {2 * P + 2 * (g - 1): j for j, g in enumerate(gaps)}              # position -> pair
    W, x0 = 780, 20
    cell = (W - 2 * x0) / L
    lift = {pos: 24 + 0.32 * (pos - 2 * j - 1) * cell for pos, j in asked.items()}
    row_y, row_h = 62 + max(lift.values()), 40
    ty = row_y + row_h + 44
    H = int(ty + 44 + 70)
    order = ", ".join(f"pair {j + 1} in slot g = {g} (position {2 * P + 2 * (g - 1)})" for j, g in enumerate(gaps))
    dr = Drawing(_name("mqar_prompt", P, L, vocab, seed), W, H,
                 f"An MQAR prompt as Zoology defines it: {P} pairs in {L} tokens",
                 f"A row of {L} tokens (vocabulary {vocab}, seed {seed}). Positions 0 to {2 * P - 1} hold {P} "
                 f"key-value pairs: keys from the lower half of the vocabulary, values from the upper half, "
                 f"none repeated. The tail, positions {2 * P} to {L - 1}, has {(L - 2 * P) // 2} slots at its even "
                 f"offsets, gap g = 1, 2, and so on. Each key is asked once more, at a gap drawn from a power law "
                 f"that favours small gaps: {order}. The other tail tokens are random filler. Under each query "
                 f"sits its target, the value that followed the same key in the pairs; an arc joins the query "
                 f"to that value.")
    dr.text(x0, 22, f"the pairs: positions 0–{2 * P - 1}", 15, anchor="start", weight="600")
    dr.text(x0 + 2 * P * cell + 6, 22, f"the tail: {(L - 2 * P) // 2} gap slots, a query at each drawn gap",
            15, anchor="start", weight="600")
    for pos, j in sorted(asked.items()):                                      # the lookups, above the row
        xa, xq = x0 + (2 * j + 1.5) * cell, x0 + (pos + 0.5) * cell
        top = row_y - 4 - 1.33 * lift[pos]
        dr.parts.append(f'<path d="M{_n(xq)},{_n(row_y - 4)} C{_n(xq)},{_n(top)} {_n(xa)},{_n(top)} '
                        f'{_n(xa)},{_n(row_y - 4)}" fill="none" stroke="{GREEN}" stroke-width="2" '
                        f'marker-end="url(#{dr._marker(GREEN)})" class="mqar-arc"/>')
    for t, tok in enumerate(tokens):
        x = x0 + t * cell
        if t < 2 * P:
            color, fill = (BLUE, 0.3) if t % 2 == 0 else (ORANGE, 0.35)
            dr.rect(x + 1.5, row_y, cell - 3, row_h, color, fill, rx=4, width=1.2)
        elif t in asked:
            dr.rect(x + 1.5, row_y, cell - 3, row_h, BLUE, 0.3, stroke=GREEN, rx=4, width=3)
        else:
            dr.rect(x + 1.5, row_y, cell - 3, row_h, INK, 0.06, rx=4, width=1.2, dashed=True)
        dr.text(x + cell / 2, row_y + row_h / 2, str(tok), 13, weight="600" if t < 2 * P or t in asked else None)
    for s in range((L - 2 * P) // 2):                                         # gap-slot labels
        dr.text(x0 + (2 * P + 2 * s + 0.5) * cell, row_y + row_h + 16, f"g{s + 1}", 13,
                weight="600" if s + 1 in gaps else None)
    dr.text(x0, ty + 15, "target", 14, anchor="start", weight="600")
    for t, y in enumerate(targets):
        if y != -100:
            x = x0 + t * cell
            dr.rect(x + 1.5, ty, cell - 3, 30, ORANGE, 0.35, rx=4)
            dr.text(x + cell / 2, ty + 15, str(y), 13, weight="600")
    dr.text(x0, H - 44, "blue: key · orange: value · green outline: a key asked again (a query) · "
            "dashed grey: random filler", 14, anchor="start")
    dr.text(x0, H - 20, "scored only at the queries: the next token must be the value bound to that key", 14,
            anchor="start")
    return dr.diagram()


def mixer_states(d_model: int = 32, seq_len: int = 32, n_heads: int = 2, window: int = 8,
                 d_state: int = 16, expand: int = 2) -> Diagram:
    """What each two-layer model of the recall lab keeps per sequence at inference, to one scale.

    One column per model (attention, sliding window, linear attention, Mamba, the Mamba +
    attention hybrid), drawing one layer's state as the matrices it holds, every number the same
    area: attention's K and V, L × d each (a row more per token); the window's last w rows of its
    one K/V head; linear attention's S (d_h × d_h) and z (d_h) per head; Mamba's d_inner × n SSM
    state and the d_inner × (d_conv − 1) inputs of its convolution. The counts are
    :meth:`attnlab.hybrid.HybridLM.state_size` of the models, built for these sizes (the global
    random state is left as it was).
    """
    from .hybrid import HybridConfig, HybridLM, LayerSpec

    sizes = dict(d_model=d_model, seq_len=seq_len, n_heads=n_heads, window=window, d_state=d_state,
                 expand=expand)
    for name, v in sizes.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"mixer_states: {name} must be a positive int, got {v!r}")
    if d_model % n_heads or d_model > 128 or seq_len > 256 or d_state > 64 or expand > 4:
        raise ValueError(f"mixer_states: needs d_model divisible by n_heads, d_model <= 128, seq_len <= 256, "
                         f"d_state <= 64 and expand <= 4, got {sizes}")
    config = HybridConfig(vocab=8, d_model=d_model, n_heads=n_heads, window=window, d_state=d_state,
                          expand=expand)
    kinds = {"attention": ("attention", "attention"), "sliding window": ("local_attention", "local_attention"),
             "linear attention": ("linear_attention", "linear_attention"), "Mamba": ("mamba", "mamba"),
             "hybrid": ("mamba", "attention")}
    # small models, built on the CPU (the meta device's first use costs seconds); the RNG is kept
    with torch.random.fork_rng(devices=[]):
        total = {name: HybridLM([LayerSpec(k) for k in ks], config).state_size(seq_len)
                 for name, ks in kinds.items()}
        one = {k: HybridLM([LayerSpec(k)], config) for k in ("attention", "local_attention", "linear_attention",
                                                             "mamba")}
    d_conv = one["mamba"].layers[0].mixer.config.d_conv
    one = {k: m.state_size(seq_len) for k, m in one.items()}
    d_h, d_inner, kept = d_model // n_heads, expand * d_model, min(seq_len, window)
    W, col, top = 800, 156, 122
    s = max(0.5, min(2.0, 64 / d_model, 150 / max(d_inner, seq_len), 240 / (d_inner + seq_len)))
    H = int(top + s * (d_inner + seq_len) + 90 + 150)

    def px(v):
        return max(2.0, v * s)

    def matrix(x, y, rows, cols, color, label="", grow=False):
        dr.rect(x, y, px(cols), px(rows), color, 0.3, rx=2)
        if label:
            dr.text(x + px(cols) / 2, y + px(rows) + 12, label, 13)
        if grow:
            dr.rect(x, y + px(rows) + 24, px(cols), 10, color, 0.08, rx=2, dashed=True)
        return y + px(rows) + (42 if grow else 26)

    def attention_layer(cx, y):
        matrix(cx + 3, y, seq_len, d_model, VERMILLION, "V", grow=True)
        return matrix(cx - px(d_model) - 3, y, seq_len, d_model, VERMILLION, "K", grow=True)

    def mamba_layer(cx, y):
        matrix(cx + 4, y, d_inner, d_conv - 1, SKY)
        dr.text(cx + 4 + px(d_conv - 1) + 4, y + px(d_inner) / 2, "conv", 13, anchor="start", rotate=90)
        return matrix(cx - px(d_state) - 4, y, d_inner, d_state, BLUE, "h")

    dr = Drawing(_name("mixer_states", d_model, seq_len, n_heads, window, d_state, expand), W, H,
                 f"The state each two-layer model keeps per sequence (d = {d_model}, L = {seq_len})",
                 f"Five columns, one per model, each drawing what one of its layers keeps between tokens at "
                 f"inference, every number the same area. Attention keeps K and V, {seq_len} × {d_model} each, "
                 f"one row more per token: {one['attention']:,} numbers per layer, {total['attention']:,} for the "
                 f"model. The sliding window keeps the last {kept} rows of one K/V head of width {d_h}: "
                 f"{one['local_attention']:,} per layer, {total['sliding window']:,} in all. Linear attention "
                 f"keeps S, {d_h} × {d_h}, and z, {d_h}, per head for {n_heads} heads: "
                 f"{one['linear_attention']:,} per layer, {total['linear attention']:,} in all. Mamba keeps a "
                 f"{d_inner} × {d_state} state and the last {d_conv - 1} inputs of its convolution: "
                 f"{one['mamba']:,} per layer, {total['Mamba']:,} in all. The hybrid has one Mamba layer and one "
                 f"attention layer: {total['hybrid']:,}. Only attention's state grows with the length.")
    look = {"attention": (VERMILLION, "2 L d", f"K, V: {seq_len} × {d_model}\n+ 1 row per token", f"{one['attention']:,}"),
            "sliding window": (ORANGE, "2 w d_{h}", f"K, V: {kept} × {d_h}\none K/V head", f"{one['local_attention']:,}"),
            "linear attention": (GREEN, "h (d_{h}² + d_{h})", f"S: {d_h} × {d_h}, z: {d_h}\nper head, {n_heads} heads",
                                 f"{one['linear_attention']:,}"),
            "Mamba": (BLUE, "d_{inner}(n + d_{conv} − 1)", f"h: {d_inner} × {d_state}\nconv: {d_inner} × {d_conv - 1}",
                      f"{one['mamba']:,}"),
            "hybrid": (PURPLE, "Mamba, then attention", "one layer\nof each",
                       f"{one['mamba']:,} + {one['attention']:,}")}
    for i, (name, (color, formula, shapes, per_layer)) in enumerate(look.items()):
        cx = 16 + col * i + col / 2
        dr.rect(cx - col / 2 + 4, 30, col - 8, 62, color, 0.12, rx=6)
        dr.text(cx, 48, name, 15, weight="600")
        dr.text(cx, 74, formula, 13)
        if name == "attention":
            attention_layer(cx, top)
        elif name == "sliding window":
            matrix(cx - px(d_h) - 3, top, kept, d_h, ORANGE, "K")
            matrix(cx + 3, top, kept, d_h, ORANGE, "V")
        elif name == "linear attention":
            y = top
            for hd in range(n_heads):
                if y + px(d_h) > H - 170:
                    dr.text(cx, y + 8, f"… {n_heads} heads", 13)
                    break
                matrix(cx - px(d_h) / 2 - 5, y, d_h, d_h, GREEN, f"S{_sub(hd + 1)}")
                y = matrix(cx + px(d_h) / 2 + 1, y, d_h, 1, GREEN)
        elif name == "Mamba":
            mamba_layer(cx, top)
        else:
            attention_layer(cx, mamba_layer(cx, top) + 4)
        dr.text(cx, H - 148, shapes, 13)
        dr.text(cx, H - 116, f"{per_layer} per layer" if name != "hybrid" else per_layer, 14)
        dr.text(cx, H - 92, f"model: {total[name]:,}", 15, weight="600")
    dr.text(W / 2, H - 52, f"one layer per column, every number the same area; dashed: the row K and V "
            f"gain per token (L = {seq_len} here)", 14)
    dr.text(W / 2, H - 28, "the window's, linear attention's and Mamba's states stay this size at any length", 14)
    return dr.diagram()


ALL += [mqar_prompt, mixer_states]


def grid_protocol() -> Diagram:
    """The recall grid's protocol, from :mod:`attnlab.experiments.mqar`'s settings: three sets of
    prompts (fresh training prompts, a fixed validation set, a fixed test set) and two stages. Stage
    (a) trains each configuration at every rate of ``GRID_LRS`` with ``SCAN_SEED``; validation
    stops a run, keeps its best weights and selects the rate. Stage (b) trains each of
    ``TEST_SEEDS`` at that rate, with the same stopping, and scores the kept weights once on the
    test set, which decides nothing.
    """
    from .experiments.mqar import GRID_LRS, SCAN_SEED, TEST_SEEDS, GridPoint

    g = GridPoint("attention", 32)
    W, H, left, mid = 720, 400, 20, 270
    dr = Drawing(_name("grid_protocol", GRID_LRS, TEST_SEEDS, g.val_size, g.test_size), W, H,
                 "The recall grid: a rate scan, then seeds scored on a test set",
                 f"Training prompts are fresh at every step. {g.val_size} fixed validation prompts, scored "
                 f"every {g.eval_every} steps, stop a run at {g.solved_at:.0%}, keep its best weights and, in "
                 f"stage (a), choose among {len(GRID_LRS)} learning rates trained with seed {SCAN_SEED}. Stage "
                 f"(b) trains seeds {', '.join(map(str, TEST_SEEDS))} at the chosen rate, and each run's kept "
                 f"weights are scored once on {g.test_size:,} test prompts, which choose nothing.")
    sets = [("training prompts", f"fresh every step, batch {g.batch}", SKY),
            ("validation", f"{g.val_size} fixed prompts", ORANGE),
            ("test", f"{g.test_size:,} fixed prompts", GREEN)]
    for i, (label, sub, color) in enumerate(sets):
        dr.box(left, 40 + i * 120, 200, 70, label, sub, color, size=16, fill_opacity=0.25)
    dr.text(left, 20, "three sets of prompts", 14, anchor="start", weight="600")
    stages = [(20, f"stage (a): every rate, seed {SCAN_SEED}", [f"lr {lr:g}" for lr in GRID_LRS],
               "choose the rate: best validation accuracy"),
              (210, f"stage (b): seeds {', '.join(map(str, TEST_SEEDS))} at that rate",
               [f"seed {s}" for s in TEST_SEEDS], "score once on test: mean, lowest to highest")]
    for y, title, runs, outcome in stages:
        dr.rect(mid, y, W - mid - 20, 170, INK, 0.04, rx=8)
        dr.text(mid + 14, y + 22, title, 15, anchor="start", weight="600")
        width = (W - mid - 20 - 28 - 2 * 12) / len(runs)
        for i, run in enumerate(runs):
            dr.box(mid + 14 + i * (width + 12), y + 42, width, 50, run,
                   f"≤ {g.steps:,} steps", PURPLE, size=15)
        dr.text(mid + (W - mid - 20) / 2, y + 120, f"validation every {g.eval_every} steps: stop at "
                                                 f"{g.solved_at:.0%}, keep the best weights", 13)
        dr.text(mid + (W - mid - 20) / 2, y + 148, outcome, 14, weight="600")
    dr.arrow((left + 200, 75), (mid - 4, 75), color=SKY, width=2)
    dr.arrow((left + 200, 75), (mid - 4, 262), color=SKY, width=2)
    dr.arrow((left + 200, 195), (mid - 4, 140), color=ORANGE, width=2)
    dr.arrow((left + 200, 195), (mid - 4, 330), color=ORANGE, width=2)
    dr.arrow((left + 200, 315), (mid - 4, 358), color=GREEN, width=2)
    dr.text(W / 2, H - 12, "nothing is chosen on the test prompts, so their accuracy is not inflated by the "
                           "choices", 13, italic=True)
    return dr.diagram()


ALL += [grid_protocol]
