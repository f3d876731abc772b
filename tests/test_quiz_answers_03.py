"""Transfer questions of chapter 03: each answer computed with attnlab (see test_quiz_answers.py)."""

import torch

from quiz_checks import accepts, correct_option, flops


# --------------------------------------------------------------------------- 03 transformer block

def test_03_block_gflops_n1024_d1024():
    from attnlab.blocks import TransformerBlock, block_flops
    n, d = 1024, 1024
    with torch.device("meta"):
        block = TransformerBlock(d, 16, bias=False)
        x = torch.zeros(1, n, d)
    counted = flops(lambda: block(x))
    assert counted == block_flops(n, d)["total"]                # the formula is what the block computes
    accepts("03-block-gflops-n1024-d1024", counted / 1e9)


def test_03_block_parameters_d256():
    from attnlab.blocks import TransformerBlock, count_parameters
    with torch.device("meta"):
        block = TransformerBlock(256, 8)
    accepts("03-block-parameters-d256", count_parameters(block))


def test_03_attention_flops_crossover():
    from attnlab.blocks import block_flops
    d = 1024

    def quadratic_minus_linear(n):
        parts = block_flops(n, d)
        quadratic = parts["QKᵀ"] + parts["AV"]
        return quadratic - (parts["total"] - quadratic)

    (n,) = [n for n in range(1, 20_000) if quadratic_minus_linear(n) == 0]
    accepts("03-attention-flops-crossover", n)


def test_03_noam_peak_lr_d1024_w1000():
    from attnlab.schedules import noam_lr
    d_model, warmup = 1024, 1000
    peak = max(noam_lr(t, d_model, warmup) for t in range(1, 10_001))
    assert peak == noam_lr(warmup, d_model, warmup)
    accepts("03-noam-peak-lr-d1024-w1000", peak)


def test_03_fp16_three_positions():
    i = torch.arange(3, 5000, dtype=torch.float64)               # i >= 3 attended positions
    rounded = (3 / i).to(torch.float16)                          # three positions carry 1
    first = int(i[:-1][rounded[:-1] == rounded[1:]][0])
    accepts("03-fp16-three-positions", first)


def test_03_refit_optimal_size_1e22():
    from attnlab.scaling import BESIROGLU
    n_opt, d_opt = BESIROGLU.compute_optimal(1e22)
    n_search, _ = BESIROGLU.compute_optimal_search(1e22)          # brute force along 6ND = C
    assert abs(n_opt / n_search - 1) < 1e-3 and 15 < d_opt / n_opt < 25
    accepts("03-refit-optimal-size-1e22", n_opt / 1e9)


def test_03_kaplan_eightfold_factor():
    from attnlab.scaling import kaplan_loss
    factor = float(kaplan_loss(8e9) / kaplan_loss(1e9))
    assert correct_option("03-kaplan-eightfold-factor").startswith(f"{factor:.3f} ")


def test_03_llama13b_refit_tokens_per_parameter():
    from attnlab.scaling import BESIROGLU
    n_params, n_tokens = 13.0e9, 1.0e12                         # quoted from Touvron et al. 2023
    n_opt, d_opt = BESIROGLU.compute_optimal(6 * n_params * n_tokens)
    assert n_tokens / n_params > 3 * d_opt / n_opt               # over-trained, on purpose
    accepts("03-llama13b-refit-tokens-per-parameter", d_opt / n_opt)
