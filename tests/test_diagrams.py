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


@pytest.mark.parametrize("lam", [0.2, 0.5])
def test_differential_head_prints_the_two_softmax_rows_and_their_difference(lam):
    s1, s2 = (0.8, 0.5, 3.0, 0.7), (0.8, 0.5, 0.6, 0.7)
    texts = _texts(diagrams.differential_head(s1, s2, lam=lam))
    a1, a2 = torch.softmax(torch.tensor(s1), 0), torch.softmax(torch.tensor(s2), 0)
    printed = [t.replace("\u2212", "-") for t in texts if re.fullmatch(r"\u2212?\d\.\d\d", t)]
    expected = [f"{v:.2f}" for v in torch.cat([a1, a2, a1 - lam * a2]).tolist()]
    assert printed == expected
    assert f"row sum 1 − λ = {1 - lam:.2f}" in texts
    with pytest.raises(ValueError, match="scores1"):
        diagrams.differential_head((1.0, 2.0), (1.0,))


def test_differential_head_default_lambda_cancels_the_common_keys_exactly():
    s1, s2 = (0.8, 0.5, 3.0, 0.7), (0.8, 0.5, 0.6, 0.7)
    texts = _texts(diagrams.differential_head(s1, s2))
    lam = float(torch.tensor(s2).exp().sum() / torch.tensor(s1).exp().sum())   # Z_2 / Z_1
    printed = [t.replace("\u2212", "-") for t in texts if re.fullmatch(r"\u2212?\d\.\d\d", t)]
    assert printed[-4:] == ["0.00", "0.00", f"{1 - lam:.2f}", "0.00"]
    assert f"× λ = {lam:.2f}" in texts and "weight cancels exactly" in texts


@pytest.mark.parametrize("p,k,a,b", [(11, 3, 4, 9), (7, 2, 6, 6), (13, 5, 0, 12)])
def test_modular_clock_lands_on_a_plus_b_mod_p(p, k, a, b):
    texts = _texts(diagrams.modular_clock(p, k, a, b))
    assert sorted(int(t) for t in texts if t.isdigit()) == list(range(p))   # every residue once
    assert f"largest at c = (a + b) mod p = {(a + b) % p}" in texts
    with pytest.raises(ValueError, match="coprime"):
        diagrams.modular_clock(12, 3, 1, 1)


def test_microgpt_architecture_counts_the_library_model():
    from attnlab.models import GPTConfig, MicroGPT
    for tie in (True, False):
        config = GPTConfig(vocab_size=50, max_len=16, n_layers=2, d_model=32, n_heads=4, tie_weights=tie)
        texts = _texts(diagrams.microgpt_architecture(config))
        total = count_parameters(MicroGPT(config))
        assert f"total {total:,}" in texts
        assert f"{50 * 32:,}" in texts and f"block × 2" in texts
        assert ("LM head (tied: 0)" in texts) is tie
    with pytest.raises(TypeError, match="config"):
        diagrams.microgpt_architecture({"vocab_size": 3})


@pytest.mark.parametrize("temperature, top_k", [(0.7, 3), (1.5, 5), (1.0, 1)])
def test_sampling_pipeline_prints_the_distribution_sample_next_draws_from(temperature, top_k):
    logits = (2.0, 1.6, 1.0, 0.2, -0.5)
    texts = _texts(diagrams.sampling_pipeline(logits, temperature=temperature, top_k=top_k))
    z = torch.tensor(logits) / temperature
    kept = z >= torch.topk(z, top_k).values[-1]
    p = torch.softmax(z.masked_fill(~kept, float("-inf")), 0)
    last_panel = texts[-12:-2]                  # five (value, label) pairs, then two captions
    printed = [float(t.replace("−", "-")) for t in last_panel[0::2]]
    assert printed == pytest.approx(p.tolist(), abs=0.006)
    assert abs(sum(printed) - 1) < 0.02
    assert texts.count("−∞") == 5 - top_k
    with pytest.raises(ValueError, match="top_k"):
        diagrams.sampling_pipeline(logits, top_k=0)


@pytest.mark.parametrize("prompt,t,max_len", [(4, 8, 12), (1, 1, 2), (3, 9, 16)])
def test_prefill_decode_reads_t_and_writes_one_per_step(prompt, t, max_len):
    texts = _texts(diagrams.prefill_decode(prompt, t, max_len))
    assert f"writes {prompt}" in texts
    attends = [int(x.split()[2].rstrip(",")) for x in texts if x.startswith("attends to ")]
    assert attends == list(range(prompt + 1, t + 2))            # one row per step: t cached + its own
    reads = attends
    assert [x for x in texts if x.isdigit()][:max_len] == [str(j) for j in range(max_len)]
    svg = _svg(diagrams.prefill_decode(prompt, t, max_len))
    empty = [r for r in svg.iter(NS + "rect") if r.get("stroke-dasharray")]
    rows = t - prompt + 2
    written = prompt + sum(1 for _ in reads)
    # every row draws max_len slots; the empty ones are those after the newest write (+ the legend)
    assert len(empty) == rows * max_len - written - sum(range(prompt, t + 1)) + 1
    with pytest.raises(ValueError, match="prefill_decode"):
        diagrams.prefill_decode(5, 4, 12)


@pytest.mark.parametrize("n_heads,kv_heads", [(8, (8, 2, 1)), (6, (3, 1))])
def test_kv_head_sharing_uses_the_library_grouping(n_heads, kv_heads):
    dia = diagrams.kv_head_sharing(n_heads, kv_heads, 64)
    texts = _texts(dia)
    for g in kv_heads:
        assert f"2 × {g} × 64 = {2 * g * 64} values" in texts
        assert ("repeat_kv: no copy" if g == n_heads else f"repeat_kv: each KV head {n_heads // g}×") in texts
        assert f"i // {n_heads // g}" in dia.desc
    lines = [e for e in _svg(dia).iter(NS + "path") if not e.get("marker-end")]
    assert len(lines) == n_heads * len(kv_heads)                # one line per query head per panel
    with pytest.raises(ValueError, match="divide"):
        diagrams.kv_head_sharing(8, (3,))


def test_mla_compression_counts_the_cache():
    from attnlab.kv_cache import kv_cache_bytes, mla_cache_bytes
    dia = diagrams.mla_compression(7168, 128, 128, 512, 64)
    texts = _texts(dia)
    mla = mla_cache_bytes(1, 512, 64, 1, bytes_per_element=1)
    mha = kv_cache_bytes(1, 128, 128, 1, bytes_per_element=1)
    assert f"cached: {mla} numbers per token" in texts
    assert f"MHA would cache 2 · 128 · 128 = {mha} numbers per token and layer" in texts
    assert f"{mha / mla:.1f} times more" in dia.desc
    with pytest.raises(ValueError, match="mla_compression"):
        diagrams.mla_compression(0)


@pytest.mark.parametrize("devices,step", [(4, 1), (3, 0), (8, 5)])
def test_ring_pass_follows_the_library_schedule(devices, step):
    from attnlab.ring import ring_schedule
    texts = _texts(diagrams.ring_pass(devices, step))
    held = [t for t in texts if t.startswith("K") and "," in t]
    assert len(held) == devices
    sub = str.maketrans("₀₁₂₃₄₅₆₇₈₉", "0123456789")
    assert [int(t.split(",")[0][1:].translate(sub)) for t in held] == ring_schedule(devices)[step]
    arrows = [e for e in _svg(diagrams.ring_pass(devices, step)).iter(NS + "path") if e.get("marker-end")]
    assert len(arrows) == devices                                  # one hand-off per device
    with pytest.raises(ValueError, match="ring_pass"):
        diagrams.ring_pass(4, 4)


@pytest.mark.parametrize("gamma,accepted", [(4, 2), (3, 3), (2, 0)])
def test_speculative_step_emits_accepted_plus_one(gamma, accepted):
    texts = _texts(diagrams.speculative_step(gamma, accepted, tokens=tuple("abcdef")))
    assert texts.count("✓ keep") == accepted
    assert texts.count("+ bonus") == (accepted == gamma)
    assert texts.count("✗ reject") == (accepted < gamma)
    assert texts.count("discarded") == max(gamma - accepted - 1, 0)
    assert any(t.startswith(f"emitted this step: {accepted + 1} token") for t in texts)
    with pytest.raises(ValueError, match="speculative_step"):
        diagrams.speculative_step(2, 3)


def test_layer_stack_draws_what_the_pattern_holds():
    from attnlab.hybrid import griffin_pattern, jamba_pattern, zamba_pattern, zamba_shared_layers
    jamba = _texts(diagrams.layer_stack(jamba_pattern(32), "Jamba"))
    assert jamba.count("A") == 4 and jamba.count("M") == 28 and jamba.count("E") == 16
    assert "4 attention, 28 Mamba; MoE FFN in 16 layers" in jamba
    zamba = diagrams.layer_stack(zamba_pattern(76), "Zamba")
    assert _texts(zamba).count("S") == len(zamba_shared_layers(76)) + 1        # + the legend's marker
    assert "before layers 2, 7, 13, 19" in zamba.desc and "13 calls of one shared block" in zamba.desc + "".join(
        _texts(zamba))
    griffin = _texts(diagrams.layer_stack(griffin_pattern(6), "Griffin"))
    assert griffin.count("R") == 4 and griffin.count("W") == 2
    with pytest.raises(TypeError, match="pattern"):
        diagrams.layer_stack(["mamba"])


def test_zamba_shared_call_lists_the_library_call_sites():
    from attnlab.hybrid import zamba_shared_layers
    d = diagrams.zamba_shared_call(76, 6)
    calls = zamba_shared_layers(76, 6)
    assert f"all {len(calls)} calls" in d.title + " ".join(_texts(d)) and len(calls) == 13
    assert any(t.startswith("call sites: before Mamba layers 2, 7, 13, …, 73") for t in _texts(d))


@pytest.mark.parametrize("a,delta,inputs", [(-1.0, 0.5, (1.0, 0.3, -0.7, 0.9, 0.4)), (-3.0, 0.2, (0.5, -1.0))])
def test_zoh_hold_prints_the_library_discretisation_and_lands_on_the_recurrence(a, delta, inputs):
    from attnlab.ssm import discretize, lti_recurrence
    dia = diagrams.zoh_hold(a, delta, inputs)
    A = torch.tensor([[a]], dtype=torch.float64)
    A_bar, B_bar = discretize(A, torch.ones_like(A), delta)
    texts = _texts(dia)
    assert f"Ā = exp(Δa) = {A_bar.item():.3f}" in texts and f"B̄ = (exp(Δa) − 1)/a = {B_bar.item():.3f}" in texts
    h = lti_recurrence(torch.tensor([[inputs]], dtype=torch.float64), A_bar, B_bar, torch.ones_like(A))[0, 0]
    assert ", ".join(f"{v:.3f}" for v in h.tolist()) in dia.desc        # the dots are the recurrence
    dots = [c for c in _svg(dia).iter(NS + "circle") if c.get("r") == "6"]
    assert len(dots) == len(inputs)
    with pytest.raises(ValueError, match="zoh_hold"):
        diagrams.zoh_hold(1.0)


@pytest.mark.parametrize("a,delta,c,length", [(-0.5, 1.0, 1.0, 5), (-2.0, 0.3, -1.5, 3)])
def test_ssm_two_readings_prints_the_library_kernel(a, delta, c, length):
    from attnlab.ssm import discretize, ssm_kernel
    dia = diagrams.ssm_two_readings(a, delta, c, length)
    A = torch.tensor([[a]], dtype=torch.float64)
    A_bar, B_bar = discretize(A, torch.ones_like(A), delta)
    K = ssm_kernel(A_bar, B_bar, torch.tensor([[c]], dtype=torch.float64), length)[0].tolist()
    texts = _texts(dia)
    assert [t for t in texts if t.replace("\u2212", "-").lstrip("-")[:1].isdigit() and "." in t] == \
        [f"{k:.3f}".replace("-", "\u2212") for k in K]                # one bar label per lag, in order
    hops = length - 2                                                  # the path u_1 -> y_{L-1}
    assert f"weight C Ā{'⁰¹²³⁴⁵'[hops]} B̄ = K{hops} = {K[hops]:.3f}".replace("-", "\u2212") in texts
    assert sum(t.startswith("h") and t[1:].isdigit() for t in texts) == length   # one state per step
    with pytest.raises(ValueError, match="ssm_two_readings"):
        diagrams.ssm_two_readings(length=9)


def test_mamba_block_prints_the_library_parameter_counts():
    from attnlab.ssm import Mamba, MambaConfig
    for sizes in [(768, 16, 4, 2), (16, 8, 3, 2)]:
        with torch.device("meta"):
            block = Mamba(MambaConfig(*sizes))
        texts = _texts(diagrams.mamba_block(*sizes))
        number = lambda label: int(texts[len(texts) - texts[::-1].index(label)].replace(",", ""))  # noqa: E731
        assert number("in_proj") == block.in_proj.weight.numel() == 2 * block.config.d_inner * sizes[0]
        assert number("out_proj") == block.out_proj.weight.numel()
        assert number("total") == count_parameters(block)
        assert f"state: {block.config.d_inner} × {sizes[1]}" in texts


@pytest.mark.parametrize("deltas,A", [((2.0, 0.01, 0.01, 2.0, 0.01, 0.01), -1.0), ((0.5, 0.0, 3.0), -2.0)])
def test_selective_scan_flow_prints_the_decays_exp_delta_a(deltas, A):
    tokens = tuple("abcdef"[:len(deltas)])
    texts = _texts(diagrams.selective_scan_flow(tokens, deltas, A))
    printed = [float(t.split()[1]) for t in texts if t.startswith("× ")]
    assert printed == [round(math.exp(d * A), 2) for d in deltas]
    assert [t for t in texts if t.startswith("Δ = ")] == [f"Δ = {d:g}" for d in deltas]
    assert [t for t in texts if t[0] in "hy"] == ["h−1"] + [f"{v}{t}" for t in range(len(deltas)) for v in "hy"]
    with pytest.raises(ValueError, match="deltas"):
        diagrams.selective_scan_flow(("a",), (1.0, 2.0))


@pytest.mark.parametrize("sizes", [(2560, None, 4), (16, 8, 3)])
def test_griffin_block_prints_the_library_state_size(sizes):
    from attnlab.rglru import GriffinRecurrentBlock
    with torch.device("meta"):
        block = GriffinRecurrentBlock(*sizes)
    dia = diagrams.griffin_block(*sizes)
    texts = _texts(dia)
    assert any(t.endswith(f"= {block.state_size():,} numbers, at any length") for t in texts)
    assert f"state: {block.d_rnn:,} numbers (one per channel)" in texts
    assert {"Linear W1", "GeLU", "Linear W2", "RG-LRU", "Linear Wout"} <= set(texts)
    with pytest.raises(ValueError, match="griffin_block"):
        diagrams.griffin_block(0)


@pytest.mark.parametrize("sizes", [(4096, 3, 2), (8, 4, 1)])
def test_hyena_operator_prints_the_library_state_size(sizes):
    from attnlab.hyena import HyenaOperator
    with torch.device("meta"):
        op = HyenaOperator(*sizes)
    texts = _texts(diagrams.hyena_operator(*sizes))
    assert f"decoding state: {op.state_size():,} numbers" in texts
    assert f"{sizes[2]} modes per channel" in texts and "long convolution h * z" in texts
    with pytest.raises(ValueError, match="hyena_operator"):
        diagrams.hyena_operator(8, 0)


@pytest.mark.parametrize("n_experts,top_k,logits", [(8, 2, None), (4, 1, (0.0, 2.0, 1.0, -1.0)), (16, 2, None)])
def test_moe_router_prints_the_softmax_and_runs_the_top_k(n_experts, top_k, logits):
    dia = diagrams.moe_router(n_experts, top_k, logits)
    texts = _texts(dia)
    if logits is None:
        logits = [round(1.4 * math.sin(2.3 * i + 1.0), 3) for i in range(n_experts)]
    p = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
    bars = [float(t) for t in texts if re.fullmatch(r"\d\.\d\d", t)]
    assert bars == [round(v, 2) for v in p.tolist()]
    chosen = sorted(p.topk(top_k).indices.tolist())
    weights = [t for t in texts if t.startswith("× p")]
    assert weights == [f"× p{str(i + 1).translate(str.maketrans('0123456789', '₀₁₂₃₄₅₆₇₈₉'))}" for i in chosen]
    assert f"the compute of {top_k} FFNs, the parameters of {n_experts}" in " ".join(texts)
    with pytest.raises(ValueError, match="top_k"):
        diagrams.moe_router(4, 5)


@pytest.mark.parametrize("length", [2, 5, 8, 13, 16])
def test_parallel_scan_levels_and_combines_are_those_of_hillis_steele(length):
    dia = diagrams.parallel_scan(length)
    root, texts = _svg(dia), _texts(dia)
    levels = math.ceil(math.log2(length))
    combines = sum(length - 2**k for k in range(levels))
    orange = [p for p in root.iter(NS + "path") if p.get("stroke") == diagrams.ORANGE]
    assert len(orange) == combines and f"{levels} levels, {combines} combines" in dia.title
    assert [t for t in texts if t.startswith("offset ")] == [f"offset {2**k}" for k in range(levels)]
    top = texts[-(2 * length + 2):]                  # the last level's spans, the h_t labels, the legend
    assert [t for t in texts if t.startswith("h")][-length:] == [f"h{t}" for t in range(length)]
    assert {"0", *(f"0–{t}" for t in range(1, length))} <= set(top)   # every node ends covering 0…t
    with pytest.raises(ValueError, match="length"):
        diagrams.parallel_scan(1)


@pytest.mark.parametrize("n_pairs,seq_len,vocab,seed", [(4, 24, 64, 2), (2, 8, 16, 0), (8, 32, 100, 5)])
def test_mqar_prompt_draws_the_library_prompt(n_pairs, seq_len, vocab, seed):
    from attnlab.tasks import mqar_zoology
    batch = mqar_zoology(1, n_pairs, seq_len, vocab=vocab, seed=seed)
    dia = diagrams.mqar_prompt(n_pairs, seq_len, vocab, seed)
    root, texts = _svg(dia), _texts(dia)
    numbers = [t for t in texts if t.isdigit()]
    asked = batch.targets[0] != -100
    row, answers = batch.inputs[0].tolist(), batch.targets[0][asked].tolist()
    assert numbers == [str(t) for t in row + answers]                # the row, then the targets
    arcs = [p for p in root.iter(NS + "path") if p.get("class") == "mqar-arc"]
    assert len(arcs) == n_pairs and all(p.get("stroke") == diagrams.GREEN for p in arcs)
    assert [t for t in texts if re.fullmatch(r"g\d+", t)] == [f"g{s + 1}" for s in range((seq_len - 2 * n_pairs) // 2)]
    for j, g in enumerate(batch.gaps[0].tolist()):
        assert f"pair {j + 1} in slot g = {g} (position {2 * n_pairs + 2 * (g - 1)})" in dia.desc
    with pytest.raises(ValueError, match="mqar_prompt"):
        diagrams.mqar_prompt(4, 12)


@pytest.mark.parametrize("sizes", [dict(d_model=32, seq_len=32),
                                   dict(d_model=64, seq_len=128, n_heads=4, window=16, d_state=8),
                                   dict(d_model=16, seq_len=4, window=8, expand=1)])
def test_mixer_states_prints_the_library_state_sizes(sizes):
    from attnlab.hybrid import HybridConfig, HybridLM, LayerSpec
    dia = diagrams.mixer_states(**sizes)
    texts = _texts(dia)
    config = HybridConfig(vocab=8, **{k: v for k, v in sizes.items() if k != "seq_len"})
    config.n_heads = sizes.get("n_heads", 2)
    config.d_state = sizes.get("d_state", 16)
    for kinds in [("attention",) * 2, ("local_attention",) * 2, ("linear_attention",) * 2, ("mamba",) * 2,
                  ("mamba", "attention")]:
        with torch.device("meta"):
            total = HybridLM([LayerSpec(k) for k in kinds], config).state_size(sizes["seq_len"])
        assert f"model: {total:,}" in texts
    assert len([t for t in texts if t.startswith("model: ")]) == 5
    assert "Only attention's state grows with the length." in dia.desc
    with pytest.raises(ValueError, match="mixer_states"):
        diagrams.mixer_states(30, 32, 4)


def test_grid_protocol_prints_the_grid_settings():
    from attnlab.experiments.mqar import GRID_LRS, TEST_SEEDS, GridPoint

    texts = _texts(diagrams.grid_protocol())
    g = GridPoint("attention", 32)
    assert [t for t in texts if t.startswith("lr ")] == [f"lr {lr:g}" for lr in GRID_LRS]
    assert [t for t in texts if t.startswith("seed ")] == [f"seed {s}" for s in TEST_SEEDS]
    assert f"{g.val_size} fixed prompts" in texts and f"{g.test_size:,} fixed prompts" in texts
