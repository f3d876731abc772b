"""Transfer questions of chapter 02: each answer computed with attnlab (see test_quiz_answers.py)."""
import math

import pytest
import torch

from quiz_checks import accepts, correct_option


# --------------------------------------------------------------------------- 02 positional encodings

def test_02_sinusoid_pe_10_6():
    from attnlab.positional import sinusoidal_encoding
    accepts("02-sinusoid-pe-10-6", sinusoidal_encoding(11, 512, dtype=torch.float64)[10, 6].item())


def test_02_learned_table_too_short():
    from attnlab.positional import LearnedPositionalEmbedding
    table = LearnedPositionalEmbedding(2048, 8)
    assert table(torch.zeros(1, 2048, 8)).shape == (1, 2048, 8)
    with pytest.raises(ValueError, match="cannot extrapolate"):
        table(torch.zeros(1, 3000, 8))
    assert correct_option("02-learned-table-too-short").startswith("Positions 2048 and beyond have no embedding")


def test_02_alibi_slopes_8_heads():
    from attnlab.positional import alibi_slopes
    slopes = alibi_slopes(8).tolist()
    assert slopes == [2.0 ** -(h + 1) for h in range(8)]
    assert correct_option("02-alibi-slopes-8-heads").startswith(f"1/{1 / slopes[0]:.0f}, 1/{1 / slopes[1]:.0f}, …, "
                                                                 f"1/{1 / slopes[-1]:.0f}")


def test_02_first_dims_near_identical():
    from attnlab.positional import frequencies
    omega = frequencies(512)[:4].double()                       # dimensions 0..7 are pairs i = 0..3
    periods = 2 * math.pi / omega
    assert (omega > 0.89).all()                                 # within about 10% of 1
    text = correct_option("02-first-dims-near-identical")
    assert f"from {periods[0]:.2f} to {periods[-1]:.1f} positions" in text


def test_02_rope_common_shift():
    from attnlab.positional import apply_rope
    q = k = torch.tensor([[1.0, 0.0]], dtype=torch.float64)          # d = 2: one plane, θ_0 = 1
    score = lambda i, j: (apply_rope(q, [i]) @ apply_rope(k, [j]).T).item()
    assert abs(score(105, 102) - score(3, 0)) < 1e-12
    accepts("02-rope-common-shift", score(105, 102))


def test_02_alibi_bias_value():
    from attnlab.positional import alibi_bias, alibi_slopes
    assert alibi_slopes(4).tolist() == [1 / 4, 1 / 16, 1 / 64, 1 / 256]
    accepts("02-alibi-bias-value", alibi_bias(4, 11)[1, 10, 4].item())


def test_02_rope_slow_planes():
    from attnlab.positional import frequencies
    wavelengths = 2 * math.pi / frequencies(16)
    accepts("02-rope-slow-planes", int((wavelengths > 32).sum()))
