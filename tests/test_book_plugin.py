"""The book plugin's page slimming: figures in their smallest exact form, plain code text."""
import base64

import numpy as np

from attnlab_book import CODE_BLOCK, TAG, _decoded, _round, _round_heatmaps, _slim


def spec(values, dtype):
    array = np.asarray(values, dtype="<" + dtype)
    out = {"dtype": dtype, "bdata": base64.b64encode(array.tobytes()).decode()}
    if array.ndim == 2:
        out["shape"] = f"{array.shape[0]}, {array.shape[1]}"
    return out


def test_slim_rounds_floats_and_halves_binary_arrays():
    values = np.array([0.123456789, 1e-9, 2.5e6], dtype="<f8")
    figure = {"data": [{"x": [0.3000000001, 2, "a"], "y": {"dtype": "f8", "bdata":
              base64.b64encode(values.tobytes()).decode(), "shape": "3"}}],
              "layout": {"sliders": [{"steps": [{"args": [{"y": [[1 / 3, 2 / 3]]}]}]}]}}
    slim = _slim(figure)
    assert slim["data"][0]["x"] == [0.3, 2, "a"]
    y = slim["data"][0]["y"]
    assert y["dtype"] == "f4"
    assert np.allclose(_decoded(y), values, rtol=1e-6) and len(y["bdata"]) < len(figure["data"][0]["y"]["bdata"])
    # short lists stay JSON, rounded
    assert slim["layout"]["sliders"][0]["steps"][0]["args"][0]["y"] == [[0.33333, 0.66667]]


def test_whole_numbers_take_the_smallest_integer_type():
    mask = np.tril(np.ones((20, 20)))
    slim = _slim({"data": [{"type": "heatmap", "z": spec(mask, "f4")},
                           {"y": list(range(-40, 40))}, {"y": spec(np.arange(70000), "i8")}]})
    z, y, big = (slim["data"][0]["z"], slim["data"][1]["y"], slim["data"][2]["y"])
    assert (z["dtype"], z["shape"]) == ("u1", "20, 20") and (_decoded(z) == mask).all()
    assert y["dtype"] == "i1" and list(_decoded(y)) == list(range(-40, 40))
    assert big["dtype"] == "u4" and (_decoded(big) == np.arange(70000)).all()


def test_slider_steps_carry_typed_arrays_per_trace():
    z0, z1 = np.random.default_rng(0).normal(size=(2, 8, 8))
    step = {"args": [{"z": [z0.tolist(), z1.tolist()], "name": ["a", "b"]}, {"title.text": "t"}]}
    slim = _slim({"data": [{"type": "heatmap"}], "layout": {"sliders": [{"steps": [step]}]}})
    args = slim["layout"]["sliders"][0]["steps"][0]["args"]
    assert [s["dtype"] for s in args[0]["z"]] == ["f4", "f4"] and args[0]["name"] == ["a", "b"]
    assert np.allclose(_decoded(args[0]["z"][1]), z1, rtol=1e-4) and args[1] == {"title.text": "t"}


def test_lists_that_are_not_numeric_arrays_stay_json():
    trace = {"text": [str(i) for i in range(30)], "x": [[1, 2], [3]] * 10,
             "colorscale": [[i / 20, "#000"] for i in range(21)]}
    assert _slim({"data": [trace]})["data"][0] == trace


def test_gaps_stay_gaps():
    y = _slim({"data": [{"y": [0.123456, None] * 10}]})["data"][0]["y"]
    assert y["dtype"] == "f4" and np.isnan(_decoded(y)[1::2]).all()
    assert np.allclose(_decoded(y)[::2], 0.12346)


def test_json_kept_where_it_is_shorter():
    mask = [[1.0, 0.0, None, 1.0]] * 8          # whole numbers with gaps: "1,0,null,1"
    assert _slim({"data": [{"z": mask}]})["data"][0]["z"] == [[1, 0, None, 1]] * 8


def test_template_keeps_defaults_of_drawn_trace_types_only():
    layout = {"template": {"data": {"scatter": [{}], "heatmap": [{}], "surface": [{}]},
                           "layout": {"font": {"size": 12}}}}
    slim = _slim({"data": [{"type": "heatmap"}, {"mode": "lines"}], "layout": layout})
    assert set(slim["layout"]["template"]["data"]) == {"scatter", "heatmap"}
    assert slim["layout"]["template"]["layout"] == {"font": {"size": 12}}


def test_code_blocks_become_plain_text_for_the_browser_to_colour():
    block = ('<div class="highlight-ipython3 notranslate"><div class="highlight"><pre><span></span>'
             '<span class="n">x</span> <span class="o">=</span> <span class="mi">1</span> '
             '<span class="o">&lt;</span> <span class="n">y</span></pre></div>')
    plain = CODE_BLOCK.sub(lambda m: f"{m[1]} data-attnlab-hl>{TAG.sub('', m[2])}</pre>", block)
    assert plain.endswith('<pre data-attnlab-hl>x = 1 &lt; y</pre></div>')


def test_nan_becomes_a_json_gap():
    import json

    values = np.array([[1.5, np.nan], [np.nan, 2.25]] * 8)
    figure = {"data": [{"z": spec(values, "f8")}]}
    text = json.dumps(_round(figure, 4, lists=True), allow_nan=False)
    assert '[1.5,null]' in text.replace(" ", "")


def test_heatmaps_keep_a_thousandth_of_their_largest_value():
    z = [[0.123456, 1.98765, 3e-9]] * 8
    step = {"args": [{"z": [z, None], "y": [None, [0.123456] * 20]}, {}, [0, 1]]}
    figure = {"data": [{"type": "heatmap", "z": z}, {"type": "scatter", "y": [0.123456] * 20}],
              "layout": {"sliders": [{"steps": [step]}]}}
    out = _round_heatmaps(figure)
    assert out["data"][0]["z"][0] == [0.123, 1.988, 0] and out["data"][1] == figure["data"][1]
    args = out["layout"]["sliders"][0]["steps"][0]["args"]
    assert args[0]["z"][0][0] == [0.123, 1.988, 0] and args[0]["y"] == step["args"][0]["y"]
    big = _round_heatmaps({"data": [{"type": "heatmap", "z": spec([[1234.5678, 5.5]] * 8, "f8")}]})
    assert big["data"][0]["z"][0] == [1235, 6]     # a step of 1: the power of ten under 1234/1000
