"""Transfer questions of chapter 07: each answer computed with attnlab (see test_quiz_answers.py).

(07-backward-saved-numbers is computed in tests/test_quiz_answers.py.)
"""
import math

import torch

from quiz_checks import accepts, correct_option, flops


def _tiles(n: int, block: int, causal: bool = True) -> list[tuple[int, int, int, int]]:
    from attnlab.flash import flash_trace
    x = torch.zeros(1, 1, n, 4, dtype=torch.float64)
    _, trace = flash_trace(x, x, x, causal=causal, block_q=block, block_k=block)
    return [snapshot["tile"] for snapshot in trace]


def test_07_causal_tiles_n1024_b64():
    accepts("07-causal-tiles-n1024-b64", len(_tiles(1024, 64)))


def test_07_fa1_block_columns():
    from attnlab.flash import fa1_block_sizes
    accepts("07-fa1-block-columns", fa1_block_sizes(98_304, 128)[1])


def test_07_fa1_block_rows():
    from attnlab.flash import fa1_block_sizes
    accepts("07-fa1-block-rows", fa1_block_sizes(16_384, 128)[0])


def test_07_standard_hbm_accesses():
    from attnlab.flash import hbm_accesses_standard
    accepts("07-standard-hbm-accesses", hbm_accesses_standard(1024, 64))


def test_07_backward_flops():
    from attnlab.flash import flash_attention
    from torch.utils.flop_counter import FlopCounterMode
    q, k, v = (torch.randn(1, 1, 1024, 64).requires_grad_() for _ in range(3))
    out = flash_attention(q, k, v, block_q=512, block_k=512)
    with FlopCounterMode(display=False) as counter:
        out.sum().backward()
    accepts("07-backward-flops", counter.get_total_flops())


def test_07_standard_intensity():
    from attnlab.attention import scaled_dot_product_attention
    from attnlab.flash import hbm_accesses_standard
    n, d = 8192, 128
    q = torch.zeros(1, 1, n, d, device="meta")
    counted = flops(lambda: scaled_dot_product_attention(q, q, q))        # 4 n² d
    accepts("07-standard-intensity", counted / (2 * hbm_accesses_standard(n, d)))


def test_07_fa2_kv_reads():
    tiles = _tiles(4096, 128, causal=False)
    reads_of_first_key_block = sum(1 for (_, _, k0, _) in tiles if k0 == 0)   # once per query block
    accepts("07-fa2-kv-reads", reads_of_first_key_block)


def test_07_merge_two_states():
    from attnlab.ring import merge_partials
    one = dict(dtype=torch.float64)
    # (m, ℓ, o) -> (o/ℓ, m + log ℓ), the log-sum-exp form merge_partials takes
    out_a, lse_a = torch.tensor([[3 / 1.5]], **one), torch.tensor([2 + math.log(1.5)], **one)
    out_b, lse_b = torch.tensor([[-1 / 0.5]], **one), torch.tensor([4 + math.log(0.5)], **one)
    out, _ = merge_partials(out_a, lse_a, out_b, lse_b)
    accepts("07-merge-two-states", out.item())


def test_07_crossover_d():
    from attnlab.flash import hbm_accesses_flash, hbm_accesses_standard
    sram, n = 49_152, 8192
    crossover = min(d for d in range(8, 1025, 8)
                    if hbm_accesses_flash(n, d, sram) >= hbm_accesses_standard(n, d))
    accepts("07-crossover-d", crossover)
    accepts("07-crossover-d", math.sqrt(sram / 3))


def test_07_fa2_intensity_bound():
    from attnlab.flash import hbm_accesses_flash2
    n, d, sram, peak, bandwidth = 8192, 64, 98_304, 312e12, 2.039e12
    intensity = 4 * n * n * d / (2 * hbm_accesses_flash2(n, d, sram, block_r=64))
    assert intensity < peak / bandwidth                                  # memory-bound
    share = intensity * bandwidth / peak
    assert correct_option("07-fa2-intensity-bound").startswith(
        f"Memory-bound: about {round(intensity)} FLOP/byte, below the ridge; the model allows "
        f"about {share:.0%} of the peak.")
