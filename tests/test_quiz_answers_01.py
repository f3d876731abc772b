"""Transfer questions of chapter 01: each answer computed with attnlab (see test_quiz_answers.py)."""

import torch

from quiz_checks import accepts, correct_option


# --------------------------------------------------------------------------- 01 attention from scratch

def test_01_weights_per_head_n4096():
    from attnlab.attention import scaled_dot_product_attention
    q = torch.zeros(1, 1, 4096, 1, device="meta")
    _, weights = scaled_dot_product_attention(q, q, q, return_weights=True)
    accepts("01-weights-per-head-n4096", weights[0, 0].numel())


def test_01_causal_mask_n3():
    from attnlab.attention import causal_mask
    rows = ", ".join("[" + ", ".join("T" if x else "F" for x in row) + "]" for row in causal_mask(3).tolist())
    assert correct_option("01-causal-mask-n3").startswith(f"[{rows}]")


def test_01_mha_parameters_d512():
    from attnlab.attention import MultiHeadAttention
    from attnlab.blocks import count_parameters
    with torch.device("meta"):
        counts = {h: count_parameters(MultiHeadAttention(512, h, bias=False)) for h in (1, 8, 16)}
    assert len(set(counts.values())) == 1                       # whatever the number of heads
    accepts("01-mha-parameters-d512", counts[8])


def test_01_doubling_length_cost():
    from attnlab.blocks import block_flops
    n, d = 8192, 64
    attention = lambda n: block_flops(n, d)["QKᵀ"] + block_flops(n, d)["AV"]   # noqa: E731
    ratio = attention(2 * n) / attention(n)
    assert correct_option("01-doubling-length-cost").startswith(f"{ratio:.0f}:")
