"""Every transfer question's answer is computed here with attnlab (or torch), so the banks cannot
drift from the code: one small test per question (chapters 01-04, 08-12 in test_quiz_answers_NN.py), which looks the question up by its id.

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
