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


def test_01_gqa_parameters_d4096():
    from attnlab.attention import MultiHeadAttention
    from attnlab.blocks import count_parameters
    with torch.device("meta"):
        count = count_parameters(MultiHeadAttention(4096, 32, n_kv_heads=8, bias=False))
    accepts("01-gqa-parameters-d4096", count)


def test_01_bottom_right_mask_n2_m5():
    from attnlab.attention import causal_mask
    accepts("01-bottom-right-mask-n2-m5", int(causal_mask(2, 5)[0].sum()))


def test_01_gqa_weights_shape():
    from attnlab.attention import scaled_dot_product_attention
    q = torch.zeros(2, 8, 10, 64, device="meta")
    k = v = torch.zeros(2, 2, 30, 64, device="meta")
    _, weights = scaled_dot_product_attention(q, k, v, return_weights=True)
    assert correct_option("01-gqa-weights-shape").startswith(f"{tuple(weights.shape)}:")


def test_01_attention_lstm_crossover():
    from attnlab.blocks import block_flops
    from quiz_checks import flops
    d = 1024
    with torch.device("meta"):                    # one LSTM step, counted: 16 d² FLOPs
        cell, x = torch.nn.LSTMCell(d, d, bias=False), torch.zeros(1, d)
        lstm_step = flops(lambda: cell(x, (x, x)))

    def attention(n):                             # the layer without the feed-forward part
        parts = block_flops(n, d)
        return sum(parts[k] for k in ("QKV projections", "QKᵀ", "AV", "output projection"))

    (equal,) = [n for n in range(1, 4 * d) if attention(n) == n * lstm_step]
    accepts("01-attention-lstm-crossover", equal)
