"""The book plugin's figure slimming: rounded floats, float32 binary arrays, nothing else."""
import base64

import numpy as np

from attnlab_book import _slim


def test_slim_rounds_floats_and_halves_binary_arrays():
    values = np.array([0.123456789, 1e-9, 2.5e6], dtype="<f8")
    figure = {"data": [{"x": [0.3000000001, 2, "a"], "y": {"dtype": "f8", "bdata":
              base64.b64encode(values.tobytes()).decode(), "shape": "3"}}],
              "layout": {"sliders": [{"steps": [{"args": [{"y": [[1 / 3, 2 / 3]]}]}]}]}}
    slim = _slim(figure)
    assert slim["data"][0]["x"] == [0.3, 2, "a"]
    y = slim["data"][0]["y"]
    assert y["dtype"] == "f4" and y["shape"] == "3"
    decoded = np.frombuffer(base64.b64decode(y["bdata"]), dtype="<f4")
    assert np.allclose(decoded, values, rtol=1e-6) and len(y["bdata"]) < len(figure["data"][0]["y"]["bdata"])
    assert slim["layout"]["sliders"][0]["steps"][0]["args"][0]["y"] == [[0.33333, 0.66667]]


def test_slim_leaves_integer_arrays_alone():
    ints = {"dtype": "i4", "bdata": base64.b64encode(np.arange(4, dtype="<i4").tobytes()).decode()}
    assert _slim({"z": ints}) == {"z": ints}
