"""Concept diagrams: valid, accessible SVG that follows the page colour, with numbers from the library."""
import math
import re
import xml.etree.ElementTree as ET

import pytest
import torch

from attnlab import diagrams
from attnlab.blocks import TransformerBlock, count_parameters
from attnlab.positional import alibi_slopes, frequencies

NS = "{http://www.w3.org/2000/svg}"


def _svg(diagram) -> ET.Element:
    return ET.fromstring(diagram._repr_html_())


def _texts(diagram) -> list[str]:
    return ["".join(t.itertext()).replace("\u200b", "") for t in _svg(diagram).iter(NS + "text")]


@pytest.fixture(scope="module")
def drawn():
    return {fn.__name__: fn() for fn in diagrams.ALL}


@pytest.mark.parametrize("name", [fn.__name__ for fn in diagrams.ALL])
def test_each_diagram_is_accessible_theme_following_svg(drawn, name):
    d = drawn[name]
    html = d._repr_html_()
    root = ET.fromstring(html)  # parses as XML
    assert root.tag == NS + "svg" and root.get("role") == "img" and root.get("viewBox")
    assert root.get("width") == "100%" and "max-width" in root.get("style")
    title, desc = root.find(NS + "title"), root.find(NS + "desc")
    assert title is not None and title.text and desc is not None and len(desc.text) > 40
    assert root.get("aria-labelledby").split() == [title.get("id"), desc.get("id")]
    assert "currentColor" in html
    assert not re.search(r'(fill|stroke|color)="(#000|#000000|black)"', html, re.I), "text would vanish in dark mode"
    sizes = [float(t.get("font-size")) for t in root.iter(NS + "text")]
    assert min(sizes) >= 13
    assert html == getattr(diagrams, name)()._repr_html_()  # identical on every call
    assert repr(d) == f"Diagram: {d.title}"


def test_ids_are_unique_across_diagrams(drawn):
    ids = [el.get("id") for d in drawn.values() for el in _svg(d).iter() if el.get("id")]
    assert len(ids) == len(set(ids))
    markers = [m.get("id") for d in drawn.values() for m in _svg(d).iter(NS + "marker")]
    assert len(markers) >= len(drawn) - 1  # every diagram with arrows has its own arrowhead
    other = _svg(diagrams.qkv_lookup((1.0, 0.0)))  # other arguments, other ids
    assert other.get("aria-labelledby") != _svg(drawn["qkv_lookup"]).get("aria-labelledby")


@pytest.mark.parametrize("scores", [(2.0, 0.5, -1.0, 1.0), (0.0, 3.0, 1.5)])
def test_qkv_lookup_prints_the_softmax_of_its_scores(scores):
    texts = _texts(diagrams.qkv_lookup(scores))
    printed = [float(t.split("=")[1]) for t in texts if t.startswith("α")]
    expected = torch.softmax(torch.tensor(scores, dtype=torch.float64), 0)
    assert printed == [round(w, 2) for w in expected.tolist()]
    printed_scores = [float(t.split("=")[1].replace("\u2212", "-")) for t in texts if t.startswith("s")
                      and "=" in t and "q·k" not in t]
    assert printed_scores == list(scores)


def test_rope_rotation_angles_come_from_frequencies():
    d, base, positions = 8, 10.0, (0, 1, 2, 3)
    dia = diagrams.rope_rotation(d, positions, base)
    theta = frequencies(d, base).tolist()
    printed = [float(t.split("=")[1].split()[0]) for t in _texts(dia) if t.startswith("θ")]
    assert printed == [round(t, 3) for t in theta]
    arrows = [g for g in _svg(dia).iter(NS + "g") if g.get("class") == "rope-arrow"]
    assert len(arrows) == len(theta) * len(positions)
    for k, g in enumerate(arrows):
        cx, cy, x, y = map(float, re.findall(r"-?\d+(?:\.\d+)?", g.find(NS + "path").get("d")))
        angle = positions[k % len(positions)] * theta[k // len(positions)]
        drawn = math.atan2(cy - y, x - cx)
        assert abs(math.remainder(drawn - angle, 2 * math.pi)) < 0.01
    assert "base = 10)" in dia.title and "base = 10 for visibility" in dia.desc


def test_alibi_bias_grid_uses_the_library_slopes():
    n, h = 6, 4
    texts = _texts(diagrams.alibi_bias_grid(n, h))
    slopes = alibi_slopes(h).tolist()
    assert [t for t in texts if t.startswith("head")] == \
        [f"head {i + 1}: slope 1/{round(1 / s)}" for i, s in enumerate(slopes)]
    cells = [t for t in texts if re.fullmatch(r"\u2212?\d+(\.\d+)?", t)]
    assert len(cells) == h * n * (n + 1) // 2  # masked cells carry no number
    assert f"\u2212{slopes[0] * (n - 1):g}" in cells
    big = _texts(diagrams.alibi_bias_grid(12, 2))  # too many cells: shading only, no numbers
    assert not [t for t in big if re.fullmatch(r"\u2212?\d+(\.\d+)?", t)]


@pytest.mark.parametrize("d_model,d_ff,n_heads", [(768, 3072, 12), (64, 96, 4)])
def test_parameter_map_totals_match_a_bias_free_block(d_model, d_ff, n_heads):
    with torch.device("meta"):
        block = TransformerBlock(d_model, n_heads, d_ff, bias=False)
    weights = count_parameters(block) - count_parameters(block.norm1) - count_parameters(block.norm2)
    texts = _texts(diagrams.parameter_map(d_model, d_ff, n_heads))
    total = next(t for t in texts if t.startswith("block total"))
    assert int(total.rsplit("=", 1)[1].replace(",", "")) == weights == 4 * d_model**2 + 2 * d_model * d_ff
    attn = next(t for t in texts if t.startswith("attention"))
    assert int(attn.rsplit("=", 1)[1].replace(",", "")) == count_parameters(block.attn)
