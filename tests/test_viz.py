"""Figure builders: kernel-free sliders carry one step per frame with data and "title.text"."""
import pytest
import torch

from attnlab import viz
from attnlab.attention import attention_entropy


def test_attention_heatmap_slider_over_layers_and_heads():
    w = torch.softmax(torch.randn(2, 3, 4, 5), -1)
    fig = viz.attention_heatmap(w, list("abcd"), list("abcde"), entropy=attention_entropy(w).mean(-1))
    steps = fig.layout.sliders[0].steps
    assert len(steps) == 6
    assert steps[4].label == "layer 1 · head 1"
    data, layout = steps[4].args
    assert torch.allclose(torch.tensor(data["z"][0]), w[1, 1].double())
    assert "title.text" in layout and "entropy" in layout["title.text"]
    with pytest.raises(ValueError, match="weights must be"):
        viz.attention_heatmap(torch.rand(4, 5))


def test_saturation_explorer_updates_only_the_bar_trace():
    rows = torch.softmax(torch.randn(3, 6), -1)
    fig = viz.saturation_explorer([0.5, 1, 2], {"entropy": [1, 2, 3], "max": [0.1, 0.2, 0.3]}, rows,
                                  x_title="β", x_symbol="β")
    data, layout, traces = fig.layout.sliders[0].steps[2].args
    assert list(traces) == [2] and layout["shapes[0].x0"] == 2
    assert len(data["y"][0]) == 6
    with pytest.raises(ValueError, match="one row per x value"):
        viz.saturation_explorer([1, 2], {"e": [1, 2]}, rows, x_title="β", x_symbol="β")


def test_memory_chart_dtype_slider_scales_bytes():
    fig = viz.memory_chart([1, 10], {"weights": [1, 100]})
    fp32, bf16 = (s.args[0]["y"][0] for s in fig.layout.sliders[0].steps[:2])
    assert list(fp32) == [4, 400] and list(bf16) == [2, 200]


def test_line_chart_and_mask_gallery():
    fig = viz.line_chart([1, 2], {"a": [1, 2], "b": ([1, 3], [2, 2])}, x_title="x", y_title="y", dashed=["b"])
    assert len(fig.data) == 2 and fig.data[1].line.dash == "dash"
    fig = viz.mask_gallery({"causal": torch.tril(torch.ones(3, 3)), "full": torch.ones(3, 3)})
    assert len(fig.data) == 2
def test_bar_chart():
    fig = viz.bar_chart(['a', 'b'], [1e-7, 0.5], y_title='error', log_y=True)
    assert fig.layout.yaxis.type == 'log' and list(fig.data[0].x) == ['a', 'b']


def test_repeated_tokens_stay_distinct_on_the_axes():
    fig = viz.attention_heatmap(torch.ones(1, 3, 3) / 3, ["the", "cat", "the"], ["the", "cat", "the"])
    assert len(set(fig.data[0].y)) == 3


def test_heatmap_and_curve_updates_both_traces():
    fig = viz.heatmap_and_curve([torch.zeros(2, 3), torch.ones(4, 4)], [0, 1], [[0, 1], [1, 0]], ["a", "b"], ["A", "B"])
    data, layout, traces = fig.layout.sliders[0].steps[1].args
    assert list(traces) == [0, 1] and layout["title.text"] == "B"
    assert list(data["y"][1]) == [1, 0] and len(data["z"][0]) == 4


def test_line_slider_switches_x_and_y_of_every_series():
    steps = [{"a": ([1, 2], [3, 4]), "opt": ([1], [3])}, {"a": ([5, 6], [7, 8]), "opt": ([6], [8])}]
    fig = viz.line_slider(steps, ["s0", "s1"], ["T0", "T1"], x_title="x", y_title="y", points=["opt"])
    data, layout, traces = fig.layout.sliders[0].steps[1].args
    assert list(traces) == [0, 1] and list(data["x"][0]) == [5, 6] and layout["title.text"] == "T1"
    assert fig.data[1].mode == "markers"


def test_spread_slider_draws_each_spread_and_switches_it():
    steps = [{"a": ([1, 2], [0.5, 0.6], [0.4, 0.6], [0.7, 0.9]), "chance": ([1, 2], [0.1, 0.1])},
             {"a": ([3, 4], [0.2, 0.3], [0.1, 0.3], [0.2, 0.5]), "chance": ([3, 4], [0.1, 0.1])}]
    fig = viz.spread_slider(steps, ["s0", "s1"], ["T0", "T1"], x_title="x", y_title="y", references=["chance"])
    bar = fig.data[0].error_y
    assert list(bar.array) == pytest.approx([0.2, 0.3]) and list(bar.arrayminus) == pytest.approx([0.1, 0.0])
    assert fig.data[1].line.dash == "dash" and not fig.data[1].error_y.visible
    data, layout, traces = fig.layout.sliders[0].steps[1].args
    assert list(data["x"][0]) == [3, 4] and list(data["error_y"][0]["array"]) == pytest.approx([0.0, 0.2])
    assert layout["title.text"] == "T1" and list(traces) == [0, 1]


def test_tile_replay_moves_the_outline():
    w = torch.full((2, 4, 4), float("nan"))
    w[0, :2, :2], w[1, :2] = 0.5, 0.25
    fig = viz.tile_replay(w, [(0, 2, 0, 2), (0, 2, 2, 4)], {"m": [torch.zeros(4), torch.ones(4)]},
                          {"final": torch.ones(4)}, ["t1", "t2"])
    data, layout, traces = fig.layout.sliders[0].steps[1].args
    assert layout["shapes[0].x0"] == 1.5 and list(traces) == [0, 1]
    assert fig.layout.shapes[0].x1 == 1.5
