"""Transfer questions of chapter 07: each answer computed with attnlab (see test_quiz_answers.py).

(The chapter's first three transfer questions, 07-causal-tiles-visited, 07-causal-tiles-n64 and
07-backward-saved-numbers, are computed in tests/test_quiz_answers.py.)
"""
import torch

from quiz_checks import accepts, flops


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
