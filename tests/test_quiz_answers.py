"""Every transfer question's answer is computed here with attnlab (or torch), so the banks cannot
drift from the code: one small test per question (chapters 01-04, 08 and 09 in test_quiz_answers_0N.py), which looks the question up by its id.

Numeric questions: the computed number, typed in full into the widget, must be judged correct by
jupyterquiz's own rule (attnlab.quiz.judge_numeric: rounding to ``precision`` significant digits,
first matching answer wins). Choice questions: the computed fact must be what the correct option says.
"""
import math
import re

import pytest
import torch
import torch.nn.functional as F

from quiz_checks import GiB, MiB, accepts, correct_option, flops
from pathlib import Path

from attnlab.quiz import bank_names, find_question, load_quiz


def test_every_transfer_question_has_a_test():
    files = sorted(Path(__file__).parent.glob("test_quiz_answers*.py"))
    source = "".join(p.read_text(encoding="utf-8") for p in files)
    ids = [q["id"] for name in bank_names() for q in load_quiz(name) if q["kind"] == "transfer"]
    missing = [qid for qid in ids if f'"{qid}"' not in source]
    assert not missing, f"transfer questions without a test in tests/test_quiz_answers*.py: {missing}"


# --------------------------------------------------------------------------- 07 FlashAttention

def test_07_backward_saved_numbers():
    from attnlab.flash import flash_forward
    q = torch.randn(1, 1, 4096, 64)
    out, lse = flash_forward(q, q, q, block_q=1024, block_k=1024)
    accepts("07-backward-saved-numbers", out.numel() + lse.numel())


# --------------------------------------------------------------------------- 10 state space models

def test_10_euler_a_bar():
    from attnlab.ssm import discretize
    a_bar, _ = discretize(torch.tensor([-8.0]), torch.tensor([1.0]), 0.5, method="euler")
    accepts("10-euler-a-bar", a_bar.item())


def test_10_zoh_memory_length():
    from attnlab.ssm import discretize
    a_bar, _ = discretize(torch.tensor([-1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64), 0.01)
    accepts("10-zoh-memory-length", -1 / math.log(a_bar.item()))    # e-folding time in tokens
    accepts("10-zoh-memory-length", 1 / (1 - a_bar.item()))          # total weight Σ ā^k of the past


def test_10_state_size_d1536():
    from attnlab.ssm import state_size
    accepts("10-state-size-d1536", state_size(1536, 16, 4))


# --------------------------------------------------------------------------- 11 Mamba

def test_11_float32_exp_overflow():
    limit = math.log(torch.finfo(torch.float32).max)
    assert torch.isinf(torch.exp(torch.tensor(limit + 0.01))) and torch.isfinite(torch.exp(torch.tensor(limit - 0.01)))
    accepts("11-float32-exp-overflow", limit)


def test_11_blocked_scan_steps():
    length, chunk = 4096, 64
    accepts("11-blocked-scan-steps", chunk + length // chunk)   # T steps inside the chunks, L/T across them


def test_11_jamba_ssm_state_mb():
    from attnlab.hybrid import ssm_state_bytes
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


# --------------------------------------------------------------------------- 12 hybrid architectures

def test_12_jamba_attention_layers():
    from attnlab.hybrid import jamba_pattern
    accepts("12-jamba-attention-layers", sum(spec.mixer == "attention" for spec in jamba_pattern(32)))


def test_12_hybrid_cost_growth():
    from attnlab.hybrid import forward_flops, local_exponent
    d = 4096
    share = lambda n: (lambda p: p["attention (quadratic)"] / (p["total"] - p["attention (quadratic)"]))(   # noqa: E731
        forward_flops(n, d, 32, 1 / 8))
    assert share(220_000) < 1 < share(240_000)                   # the crossover, about 230K tokens
    ns = [2**20, 2**24]
    assert local_exponent(ns, [forward_flops(n, d, 32, 1 / 8)["total"] for n in ns])[0] > 1.9
    assert correct_option("12-hybrid-cost-growth").startswith("O(N²)")
    assert "about 230K tokens at d = 4096" in correct_option("12-hybrid-cost-growth")


def test_12_jamba_kv_cache_gib():
    from attnlab.kv_cache import kv_cache_bytes
    accepts("12-jamba-kv-cache-gib", kv_cache_bytes(4, 8, 128, 262144, bytes_per_element=2) / GiB)


def test_12_griffin_recurrent_per_attention():
    from attnlab.hybrid import griffin_pattern
    mixers = [spec.mixer for spec in griffin_pattern(12)]
    accepts("12-griffin-recurrent-per-attention", mixers.count("rglru") / mixers.count("local_attention"))


def test_12_switch_loss_extremes():
    from attnlab.moe import switch_load_balancing_loss
    e, t = 8, 64
    balanced = switch_load_balancing_loss(torch.full((t, e), 1 / e), torch.arange(t)[:, None] % e, e)
    collapsed = switch_load_balancing_loss(F.one_hot(torch.zeros(t, dtype=torch.long), e).float(),
                                           torch.zeros(t, 1, dtype=torch.long), e)
    assert (balanced.item(), collapsed.item()) == (1.0, float(e))
    assert correct_option("12-switch-loss-extremes") == "1 and E."


# --------------------------------------------------------------------------- 13 recall lab

def test_13_mqar_prompt_length():
    from attnlab.tasks import mqar
    accepts("13-mqar-prompt-length", mqar(1, 8, n_queries=8).inputs.shape[1])


def test_13_no_lookup_accuracy():
    from attnlab.tasks import mqar
    batch = mqar(20_000, 8, n_keys=64, n_values=64)
    answers = batch.targets[batch.query_mask]
    best_guess = torch.bincount(answers).max().item() / answers.numel()   # always guess the commonest value
    assert len(answers.unique()) == 64 and abs(best_guess - 1 / 64) < 0.002
    assert correct_option("13-no-lookup-accuracy").startswith(f"1/64, about {1 / 64:.3f}")


def test_13_attention_cache_numbers():
    from attnlab.kv_cache import KVCache
    cache = KVCache(2, 1, 1, 32, 16, dtype=torch.float32)      # 2 layers, width 16, 32 positions
    accepts("13-attention-cache-numbers", cache.nbytes() // 4)


def test_13_linear_attention_state():
    from attnlab.hybrid import CausalLinearAttention
    accepts("13-linear-attention-state", CausalLinearAttention(32, 2).state_size())


# --------------------------------------------------------------------------- 14 frontiers

def test_14_speculative_tokens_per_pass():
    from attnlab.speculative import expected_tokens_per_step
    accepts("14-speculative-tokens-per-pass", expected_tokens_per_step(0.8, 4))


def test_14_mha_cache_per_token():
    from attnlab.kv_cache import kv_cache_bytes, mla_cache_bytes
    mha = kv_cache_bytes(1, 128, 128, 1, bytes_per_element=1)
    assert mla_cache_bytes(1, 512, 64, 1, bytes_per_element=1) == 576
    accepts("14-mha-cache-per-token", mha)


def test_14_vit_patch_count():
    patches = torch.nn.Conv2d(3, 8, kernel_size=16, stride=16)(torch.zeros(1, 3, 224, 224))
    accepts("14-vit-patch-count", patches.flatten(2).shape[-1])


def test_accepts_fails_on_a_wrong_number():
    """The helper itself: a wrong computation would fail the test."""
    with pytest.raises(AssertionError):
        accepts("05-llama3-8b-cache-8k-fp8", 1.0)
    with pytest.raises(AssertionError):
        accepts("01-scaling-factor", 1.0)                        # not a transfer question
    assert re.match(r"^\d{2}-", find_question("14-vit-patch-count")["id"])
