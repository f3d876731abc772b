"""Transfer questions of chapter 03: each answer computed with attnlab (see test_quiz_answers.py)."""

import torch

from quiz_checks import accepts, correct_option, flops


# --------------------------------------------------------------------------- 03 transformer block

def test_03_block_gflops_n512_d768():
    from attnlab.blocks import TransformerBlock, block_flops
    n, d = 512, 768
    with torch.device("meta"):
        block = TransformerBlock(d, 8, bias=False)
        x = torch.zeros(1, n, d)
    counted = flops(lambda: block(x))
    assert counted == block_flops(n, d)["total"]                # the formula is what the block computes
    accepts("03-block-gflops-n512-d768", counted / 1e9)


def test_03_noam_peak_lr():
    from attnlab.schedules import noam_lr
    peak = max(noam_lr(t, 512, 4000) for t in range(1, 20_001))
    assert peak == noam_lr(4000, 512, 4000)
    accepts("03-noam-peak-lr", peak)


def test_03_chinchilla_tokens_per_parameter():
    from attnlab.scaling import CHINCHILLA
    ratios = [d / n for n, d in map(CHINCHILLA.compute_optimal, (1e21, 1e25))]
    assert ratios[0] < ratios[1]
    assert correct_option("03-chinchilla-tokens-per-parameter") == (
        f"About {round(ratios[0], -1):.0f} rising to about {round(ratios[1], -1):.0f}.")


def test_03_kaplan_doubling_factor():
    from attnlab.scaling import kaplan_loss
    factor = float(kaplan_loss(2e9) / kaplan_loss(1e9))
    assert correct_option("03-kaplan-doubling-factor").startswith(f"{factor:.3f} ")
