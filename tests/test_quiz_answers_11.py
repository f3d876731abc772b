"""Transfer questions of chapter 11: each answer computed with attnlab (see test_quiz_answers.py)."""
import math

import torch
from torch.utils.flop_counter import FlopCounterMode

from quiz_checks import accepts, correct_option


def test_11_float32_exp_overflow():
    limit = math.log(torch.finfo(torch.float32).max)
    assert torch.isinf(torch.exp(torch.tensor(limit + 0.01))) and torch.isfinite(torch.exp(torch.tensor(limit - 0.01)))
    accepts("11-float32-exp-overflow", limit)


def test_11_blocked_scan_steps():
    from attnlab.ssm import _chunk_size
    length = 3000
    chunk = _chunk_size(length, None)
    assert chunk == math.ceil(math.sqrt(length)) == 55          # the default ⌈√L⌉
    accepts("11-blocked-scan-steps", chunk + -(-length // chunk))   # T inside the chunks, ⌈L/T⌉ across


def test_11_jamba_ssm_state_mb():
    from attnlab.hybrid import ssm_state_bytes
    from attnlab.ssm import state_size
    assert ssm_state_bytes(28, 8192, 16, 4, bytes_per_element=2) == 28 * state_size(8192, 16, 4) * 2
    accepts("11-jamba-ssm-state-mb", ssm_state_bytes(28, 8192, 16, 4, bytes_per_element=2) / 1e6)


def test_11_mamba_block_parameters():
    from attnlab.blocks import count_parameters
    from attnlab.hybrid import mamba_parameters
    from attnlab.ssm import Mamba, MambaConfig
    d = 1024
    with torch.device("meta"):
        counted = count_parameters(Mamba(MambaConfig(d_model=d)))
    assert counted == mamba_parameters(d)
    assert 6 <= counted / d**2 < 6.5
    assert correct_option("11-mamba-block-parameters").startswith("About 6d²")


def test_11_mamba_2p8b_state_per_layer():
    from attnlab.ssm import Mamba, MambaConfig
    with torch.device("meta"):
        block = Mamba(MambaConfig(d_model=2560, d_state=16, d_conv=4, expand=2))
    conv_state, ssm_state = block.init_state(1)
    assert block.state_size() == conv_state.numel() + ssm_state.numel()
    accepts("11-mamba-2p8b-state-per-layer", block.state_size())


def _ssd_flops(length, n, p, chunk=None):
    from attnlab.ssd import ssd_chunked, ssd_quadratic
    x, B, C = (torch.zeros(1, length, 1, s, device="meta") for s in (p, n, n))
    log_a = torch.zeros(1, length, 1, device="meta")
    with FlopCounterMode(display=False) as counter:
        if chunk is None:
            ssd_quadratic(x, log_a, B, C)
        else:
            ssd_chunked(x, log_a, B, C, chunk=chunk)
    return counter.get_total_flops()


def test_11_ssd_chunked_flops_ratio():
    from attnlab.ssd import ssd_flops
    quadratic, chunked = _ssd_flops(4096, 64, 64), _ssd_flops(4096, 64, 64, chunk=64)
    assert (quadratic, chunked) == (ssd_flops(4096, 64, 64), ssd_flops(4096, 64, 64, chunk=64))
    accepts("11-ssd-chunked-flops-ratio", quadratic / chunked)


def test_11_ssd_form_choice():
    short = _ssd_flops(64, 64, 64) < _ssd_flops(64, 64, 64, chunk=64)
    long = _ssd_flops(1024, 64, 64, chunk=64) < _ssd_flops(1024, 64, 64)
    assert short and long
    assert round(_ssd_flops(1024, 64, 64) / _ssd_flops(1024, 64, 64, chunk=64)) == 8
    assert correct_option("11-ssd-form-choice").startswith("At L = 64 the quadratic form; at L = 1024 the chunked")


def test_11_state_tensor_gb():
    from attnlab.ssm import scan_hbm_bytes
    accepts("11-state-tensor-gb", scan_hbm_bytes(2, 4096, 4096, 16, state_bytes=4)["state_tensor"] / 1e9)


def test_11_ssd_unit_decay():
    from attnlab.ssd import ssd
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64).view(1, 4, 1, 1)     # (b, L, h, p)
    B = torch.tensor([1.0, 0.0, 2.0, 1.0], dtype=torch.float64).view(1, 4, 1, 1)     # (b, L, g, n)
    C = torch.tensor([5.0, -1.0, 3.0, 2.0], dtype=torch.float64).view(1, 4, 1, 1)    # only C_3 matters for y_3
    y = ssd(x, torch.zeros(1, 4, 1, dtype=torch.float64), B, C)                        # log a_t = 0: a_t = 1
    accepts("11-ssd-unit-decay", y[0, -1, 0, 0].item())


def test_11_recompute_training_memory():
    from attnlab.ssm import scan_hbm_bytes
    per_layer = scan_hbm_bytes(4, 4096, 4096, 16, state_bytes=4)["state_tensor"]
    assert per_layer == 4 * 4096 * 4096 * 16 * 4
    accepts("11-recompute-training-memory", 48 * per_layer / 1e9)


def test_11_ssd_crossover():
    from attnlab.ssd import ssd_flops
    T, n, p = 64, 128, 64
    # per token, the chunked form (L a multiple of T) costs ssd_flops(T, chunk=T) / T; the quadratic
    # form costs ssd_flops(L) / L = L · ssd_flops(1): they are level at L* = that ratio
    level = ssd_flops(T, n, p, chunk=T) / T / ssd_flops(1, n, p)
    assert abs(level - (T + 2 * n * p / (n + p))) < 1e-9
    assert ssd_flops(3 * T, n, p) > ssd_flops(3 * T, n, p, chunk=T)                # 192 > L*: chunked wins
    assert _ssd_flops(3 * T, n, p) == ssd_flops(3 * T, n, p)                       # the count is torch's
    accepts("11-ssd-crossover", level)
