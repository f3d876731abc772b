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


def test_01_kernel_regression_temperature():
    from attnlab.attention import masked_softmax
    x = torch.tensor(1.3, dtype=torch.float64)                      # a query point
    x_j = torch.linspace(0, 5, 7, dtype=torch.float64)              # the sample positions
    sigma = 0.5
    kernel = torch.exp(-(x - x_j) ** 2 / (2 * sigma**2))
    nadaraya_watson = kernel / kernel.sum()
    s = x * x_j - x_j**2 / 2                                        # the unit-temperature score
    beta = ((nadaraya_watson[0] / nadaraya_watson[1]).log() / (s[0] - s[1])).item()
    assert torch.allclose(masked_softmax(beta * s), nadaraya_watson)
    accepts("01-kernel-regression-temperature", beta)


def test_01_tie_average():
    from attnlab.attention import scaled_dot_product_attention
    k = torch.tensor([2.0, 5.0, 5.0, 1.0], dtype=torch.float64).view(1, 1, 4, 1)   # q·k = s
    v = torch.tensor([10.0, 20.0, 40.0, 0.0], dtype=torch.float64).view(1, 1, 4, 1)
    q = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    out = scaled_dot_product_attention(q, k, v, scale=1e4)         # β = 10⁴: the limit
    accepts("01-tie-average", out.item())


def test_01_padding_mask_shape():
    import pytest
    from attnlab.attention import scaled_dot_product_attention
    b, h, m, d = 4, 8, 12, 16
    q = k = v = torch.randn(b, h, m, d)
    lengths = torch.tensor([12, 9, 5, 1])
    keep = torch.arange(m) < lengths[:, None]                      # (b, m)
    mask = keep[:, None, None, :]
    _, weights = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert weights.shape == (b, h, m, m)
    assert torch.all(weights.masked_select(~mask.expand_as(weights)) == 0)
    with pytest.raises(ValueError):                                # (b, m) does not broadcast
        scaled_dot_product_attention(q, k, v, keep)
    assert correct_option("01-padding-mask-shape").startswith(f"{tuple(mask.shape)}:")


def test_01_gqa_head_mapping():
    from attnlab.attention import repeat_kv
    h, h_kv = 8, 2
    kv_heads = torch.arange(h_kv).view(h_kv, 1, 1)                 # each kv head holds its index
    repeated = repeat_kv(kv_heads, h // h_kv)                      # as attention uses them
    accepts("01-gqa-head-mapping", int(repeated[5].item()))
