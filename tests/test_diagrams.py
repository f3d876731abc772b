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


@pytest.mark.parametrize("n,m,d_v", [(4096, 64, 64), (100, 16, 8)])
def test_linear_attention_orders_prints_counted_flops(n, m, d_v):
    from torch.utils.flop_counter import FlopCounterMode
    texts = _texts(diagrams.linear_attention_orders(n, m, d_v))
    printed = [int(t.split()[0].replace(",", "")) for t in texts if t.endswith(" FLOPs")]
    fq, fk, v = torch.zeros(n, m, device="meta"), torch.zeros(n, m, device="meta"), torch.zeros(n, d_v, device="meta")
    counted = []
    for order in (lambda: (fq @ fk.T) @ v, lambda: fq @ (fk.T @ v)):
        with FlopCounterMode(display=False) as counter:
            order()
        counted.append(counter.get_total_flops())
    assert printed == counted
    assert f"stores n² = {n * n:,}" in texts and f"({n}, {n})" in texts


def test_recurrent_state_draws_one_row_per_key_dimension_and_prints_the_decays():
    plain, gated = diagrams.recurrent_state(), diagrams.recurrent_state(alpha=(0.9, 0.2, 1.0))
    assert "the state (S, z) holds m(dv + 1) = 20 numbers at every step t" in "".join(_texts(plain))
    assert "the memory S holds m·dv = 12 numbers at every step t" in "".join(_texts(gated))
    assert "zt" in _texts(plain) and "zt" not in _texts(gated)         # the normaliser, plain only
    assert "φ(kt)" in _texts(plain) and "φ(qt)" in _texts(plain) and "kt" in _texts(gated)
    assert [t for t in _texts(gated) if t.startswith("× ")] == ["× 0.9", "× 0.2", "× 1"]
    assert "Diag(α" in gated.desc and "Diag(α" not in plain.desc


def test_hbm_sram_loop_names_the_blocks_it_highlights():
    texts = _texts(diagrams.hbm_sram_loop(t_r=3, t_c=6, i=2, j=4))
    assert "Q₃" in texts and "K₅" in texts and "V₅" in texts and "O₃" in texts
    assert any(t.startswith("K and V cross the bus once per query block (3×") for t in texts)
    assert "Q₃" in diagrams.hbm_sram_loop(3, 6, 2, 4).desc.replace("Q_3", "Q₃")
    # the SRAM box and the loop use the same running max, m' (after the tile)
    assert any("e^(S − m')" in t for t in texts) and not any(t.endswith("e^(S − m)") for t in texts)


@pytest.mark.parametrize("scores,values,block", [((1.0, 3.0, 0.5, 2.0, 4.0, -1.0), (1.0, -1.0, 2.0, 0.0, 1.0, 3.0), 2),
                                                 ((0.0, -2.0, 5.0), (2.0, 1.0, -1.0), 1)])
def test_online_softmax_state_ends_at_softmax_times_v(scores, values, block):
    from attnlab.flash import online_softmax
    dia = diagrams.online_softmax_state(scores, values, block)
    texts = [t.replace("\u2212", "-") for t in _texts(dia)]
    s = torch.tensor(scores, dtype=torch.float64)
    exact = (torch.softmax(s, 0) @ torch.tensor(values, dtype=torch.float64)).item()
    assert any(t.endswith(f"softmax(s)·v = {exact:.4f}") and f"o / ℓ = {exact:.4f}" in t for t in texts)
    ms = [float(t.split("=")[1]) for t in texts if t.startswith("m = ")]
    _, row_max, normaliser = online_softmax(s[None], block)
    assert len(ms) == -(-len(scores) // block) and ms[-1] == round(row_max.item(), 2)
    ls = [float(t.split("=")[1]) for t in texts if t.startswith("ℓ = ")]
    assert ls[-1] == round(normaliser.item(), 3)
    assert {"m₀ = −∞", "ℓ₀ = 0", "o₀ = 0"} <= set(_texts(dia))           # the empty state first
    with pytest.raises(ValueError, match="block"):
        diagrams.online_softmax_state((1.0,), (1.0,), 0)


@pytest.mark.parametrize("n,block,window,causal", [(512, 64, 80, False), (500, 64, 16, True), (96, 32, 40, False)])
def test_window_kernel_tiles_prints_the_library_tile_counts(n, block, window, causal):
    from attnlab.sparse import sliding_window_mask, tile_classes, window_tiles
    texts = _texts(diagrams.window_kernel_tiles(n, block, window, causal))
    classes = tile_classes(sliding_window_mask(n, window, causal=causal), block)
    t = classes.shape[0]
    assert f"full: {int((classes == 2).sum())}" in texts and f"partial: {int((classes == 1).sum())}" in texts
    assert f"skipped: {int((classes == 0).sum())}" in texts
    assert any(x.startswith(f"tiles computed: {window_tiles(n, block, window, causal=causal)} of {t * t} (") for x in texts)
    labels = [x for x in texts if x.isdigit()]                  # block numbers along both axes, from 0
    assert sorted(set(labels), key=int) == [str(i) for i in range(t)] and str(t) not in labels
    with pytest.raises(ValueError, match="block"):
        diagrams.window_kernel_tiles(64, 0, 4)


@pytest.mark.parametrize("slots,t", [(4, 9), (3, 1), (5, 14)])
def test_rolling_cache_puts_position_p_in_slot_p_mod_s(slots, t):
    texts = _texts(diagrams.rolling_cache(slots, t))
    held = [int(x.split("=")[1]) for x in texts if x.startswith("p = ")]
    live = list(range(max(0, t - slots + 1), t + 1))
    assert sorted(held) == live                                 # the live positions, one per slot
    assert all(p % slots == i for i, p in enumerate(held)) or t + 1 < slots
    assert f"write pointer: {t} mod {slots} = {t % slots}" in texts
    assert texts.count("empty") == max(0, slots - t - 1)
    svg = _svg(diagrams.rolling_cache(slots, t))
    arrows = [e for e in svg.iter(NS + "path") if e.get("marker-end")]
    assert len(arrows) == len(held) + 1                         # one per live slot, plus the write pointer
    assert not any(e.get("stroke-dasharray") for e in arrows)   # live positions: solid (dashed = overwritten)
    with pytest.raises(ValueError, match="slots"):
        diagrams.rolling_cache(0, 3)


@pytest.mark.parametrize("chunks,C", [(4, 4), (3, 5)])
def test_chunk_decomposition_splits_the_causal_pairs(chunks, C):
    dia = diagrams.chunk_decomposition(chunks, C)
    n = chunks * C
    diag, state = n * (C + 1) // 2, n * (n - C) // 2
    assert diag + state == n * (n + 1) // 2
    texts = _texts(dia)
    assert sum(t.startswith("S") and t[1:].isdigit() for t in texts) == chunks   # one state per chunk
    assert any(f"{diag} pairs in diagonal blocks" in t and f"{state} through the state" in t for t in texts)
    assert f"{chunks} sequential steps instead of {n}" in "".join(texts)
