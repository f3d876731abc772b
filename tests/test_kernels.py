"""The Triton FlashAttention kernel (attnlab.kernels) against torch's SDPA, through Triton's interpreter.

Skipped when Triton is missing, unless ATTNLAB_REQUIRE_TRITON=1 (make test sets it): then a
missing Triton fails the run. Blocks of 64 or more keep the interpreter quick (research/triton.md).
"""
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from attnlab import kernels
from attnlab.attention import causal_mask, scaled_dot_product_attention
from attnlab.numerics import agrees, error_ratio

REQUIRED = os.environ.get(kernels.REQUIRE_FLAG) == "1"


def _triton_importable() -> bool:
    try:
        kernels.load_triton()
    except ImportError:
        return False
    return True


HAVE = _triton_importable()
needs_triton = pytest.mark.skipif(not HAVE and not REQUIRED, reason=f"Triton is not installed ({kernels.INSTALL_HINT})")


def test_triton_is_there_when_required():
    if REQUIRED:
        assert HAVE, f"{kernels.REQUIRE_FLAG}=1 but Triton does not import; {kernels.INSTALL_HINT}"
        assert kernels.have_triton()


def _qkv(b, h, n, m, d, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, n, d, generator=g), torch.randn(b, h, m, d, generator=g),
            torch.randn(b, h, m, d, generator=g))


@needs_triton
@pytest.mark.parametrize("n,m,d,causal,block_q,block_k", [
    (1000, 1000, 64, False, 128, 128),      # masked tail: 1000 = 7 × 128 + 104
    (1000, 1000, 64, True, 128, 128),
    (77, 130, 32, True, 64, 64),            # bottom-right causal, n < m
    (130, 77, 16, True, 64, 64),            # n > m: the first 53 queries see no key
    (200, 333, 32, False, 64, 128),         # different tile sizes
])
def test_kernel_agrees_with_sdpa(n, m, d, causal, block_q, block_k):
    q, k, v = _qkv(1, 1 if n >= 1000 else 2, n, m, d, seed=n + m)   # one head for the long cases: the interpreter is slow
    out, lse = kernels.triton_flash_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
    mask = causal_mask(n, m) if causal else None
    exact = scaled_dot_product_attention(q.double(), k.double(), v.double(), causal=causal)
    theirs = torch.nan_to_num(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))  # empty rows: 0
    scale = v.abs().max().item()
    assert agrees(out, theirs, exact, scale=scale), error_ratio(out, theirs, exact, scale=scale)
    scores = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(~mask, float("-inf"))
    expected = torch.logsumexp(scores, -1)
    empty = torch.isneginf(expected)
    assert torch.equal(torch.isinf(lse), empty) and (lse[empty] > 0).all()   # +inf for a row with no key
    assert torch.allclose(lse[~empty].double(), expected[~empty], atol=1e-5)
    assert torch.equal(out[empty.expand_as(lse)], torch.zeros_like(out[empty.expand_as(lse)]))


@needs_triton
def test_float16_and_batches():
    q, k, v = (t.half() for t in _qkv(2, 3, 100, 100, 32, seed=5))
    out, _ = kernels.triton_flash_attention(q, k, v, causal=True, block_q=64, block_k=64)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert out.dtype == torch.float16 and (out.float() - ref).abs().max() < 3e-3


def test_bad_input_is_rejected_before_triton_is_needed():
    q, k, v = _qkv(1, 2, 8, 8, 16, 0)
    with pytest.raises(ValueError, match=r"triton_flash_attention: q must have shape \(b, h, n, d\)"):
        kernels.triton_flash_attention(q[0], k[0], v[0])
    with pytest.raises(TypeError, match="q must be float32 or float16, got torch.bfloat16"):
        kernels.triton_flash_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    with pytest.raises(TypeError, match="floating-point"):
        kernels.triton_flash_attention(q.long(), k.long(), v.long())
    with pytest.raises(ValueError, match="head dimension d .* power of two >= 16, got 12"):
        kernels.triton_flash_attention(q[..., :12], k[..., :12], v[..., :12])
    with pytest.raises(ValueError, match="block_q must be a power of two >= 16, got 48"):
        kernels.triton_flash_attention(q, k, v, block_q=48)
    with pytest.raises(ValueError, match="k must have shape"):
        kernels.triton_flash_attention(q, k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match="v must have k's shape"):
        kernels.triton_flash_attention(q, k, v[..., :4, :])


def test_a_missing_triton_names_the_extra_and_the_flag_turns_the_skip_into_an_error():
    """In a fresh process where `import triton` fails: a clear ImportError, have_triton() False or raising."""
    program = (
        "import os, sys; sys.modules['triton'] = None\n"        # import triton -> ImportError
        "from attnlab import kernels\n"
        "try:\n    kernels.load_triton()\nexcept ImportError as e:\n    print('MSG', e)\n"
        "print('HAVE', kernels.have_triton())\n"
        "os.environ[kernels.REQUIRE_FLAG] = '1'\n"
        "try:\n    kernels.have_triton()\nexcept ImportError as e:\n    print('REQUIRED', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (kernels.REQUIRE_FLAG, "TRITON_INTERPRET")}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=120)
    assert 'MSG attnlab.kernels needs Triton (Linux only): pip install "attnlab[kernels]"' in done.stdout, done.stderr
    assert "HAVE False" in done.stdout and 'REQUIRED attnlab.kernels needs Triton' in done.stdout


@needs_triton
def test_kernel_runs_after_torch_imported_triton_first():
    """torch.utils.flop_counter imports Triton without the interpreter; load_triton recovers."""
    program = ("import torch\nfrom torch.utils.flop_counter import FlopCounterMode\n"
               "import sys; assert 'triton' in sys.modules\n"
               "from attnlab.kernels import triton_flash_attention\n"
               "q = torch.randn(1, 1, 70, 16)\n"
               "out, _ = triton_flash_attention(q, q, q, causal=True)\n"
               "ref = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)\n"
               "assert (out - ref).abs().max() < 1e-5\n"
               "with FlopCounterMode(display=False):\n    q @ q.transpose(-1, -2)\n"
               "print('OK')\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=120)
    assert "OK" in done.stdout, done.stderr[-2000:]


def _notebook_kernel(name: str) -> str:
    import json
    from pathlib import Path
    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks/07_flash_attention.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if "".join(c["source"]).startswith(f"%%writefile {name}")]
    return "".join(cell["source"]).split("\n", 1)[1]


@needs_triton
def test_checker_passes_the_chapters_solution_and_reports_the_puzzle_unfinished(tmp_path):
    solution = tmp_path / "solution.py"
    solution.write_text(_notebook_kernel("flash_kernel_solution.py"))
    assert [r["status"] for r in kernels.check_kernel_file(solution)] == ["pass"] * len(kernels.CHECK_CASES)
    puzzle = tmp_path / "puzzle.py"
    puzzle.write_text(_notebook_kernel("my_flash_kernel.py"))
    results = kernels.check_kernel_file(puzzle)
    assert {r["status"] for r in results} == {"unfinished"}
    assert results[0]["detail"] == "fill in STEP 1, 2, 3, 4, 5, 6, 7"
    # a kernel that forgets to rescale the accumulator is caught
    wrong = tmp_path / "wrong.py"
    wrong.write_text(solution.read_text().replace("acc = acc * alpha[:, None] + tl.dot(p, v)", "acc = acc + tl.dot(p, v)"))
    assert [r["status"] for r in kernels.check_kernel_file(wrong, cases=[(77, 130, 32, True, 64, 64)])] == ["wrong"]
    with pytest.raises(ValueError, match="path must be an existing kernel file"):
        kernels.check_kernel_file(tmp_path / "missing.py")


@needs_triton
def test_checker_catches_unmasked_accesses_and_wrong_head_offsets(tmp_path):
    """The bounds check names a missing mask; three heads with n != m catch a head offset
    that uses n for K; a kernel that ignores the head passes b·h = 1 but not b·h = 3."""
    solution = _notebook_kernel("flash_kernel_solution.py")
    one_head = (77, 130, 32, True, 64, 64)
    three_heads = (96, 80, 16, False, 64, 64, 3)
    q_load = "mask=rows[:, None] < n, other=0.0)              # STEP 1"
    store = "acc / l_safe[:, None], mask=rows[:, None] < n)"
    variants = {
        "q_unmasked": solution.replace(",\n                " + q_load, ")")
                              .replace(q_load, ")"),
        "store_unmasked": solution.replace(store, "acc / l_safe[:, None])"),
        "k_offset_uses_n": solution.replace("kv = bh * m * D", "kv = bh * n * D"),
        "no_head_offset": solution.replace("Q + bh * n * D +", "Q +")
                                  .replace("O + bh * n * D +", "O +")
                                  .replace("kv = bh * m * D +", "kv ="),
    }
    for name, text in variants.items():
        assert text != solution, name
        (tmp_path / f"{name}.py").write_text(text)
    results = kernels.check_kernel_file(tmp_path / "q_unmasked.py", cases=[one_head])
    assert results[0]["status"] == "error" and "tl.load outside" in results[0]["detail"]
    assert "mask missing" in results[0]["detail"]
    results = kernels.check_kernel_file(tmp_path / "store_unmasked.py", cases=[one_head])
    assert results[0]["status"] == "error" and "tl.store outside" in results[0]["detail"]
    statuses = [r["status"] for r in kernels.check_kernel_file(tmp_path / "k_offset_uses_n.py",
                                                              cases=[one_head, three_heads])]
    assert statuses[0] == "pass" and statuses[1] != "pass"
    statuses = [r["status"] for r in kernels.check_kernel_file(tmp_path / "no_head_offset.py",
                                                              cases=[one_head, three_heads])]
    assert statuses == ["pass", "wrong"]
    assert [c[-1] for c in kernels.CHECK_CASES].count(3) == 1             # b·h = 3 is checked
    assert any(c[4] != c[5] for c in kernels.CHECK_CASES)                 # BLOCK_Q != BLOCK_K


@needs_triton
def test_a_cpu_tensor_is_refused_where_triton_compiles_for_the_gpu(monkeypatch):
    q, k, v = _qkv(1, 1, 16, 16, 16, 0)
    monkeypatch.setenv("TRITON_INTERPRET", "0")        # as on a machine with a CUDA GPU
    with pytest.raises(ValueError, match="must be on it"):
        kernels.triton_flash_attention(q, k, v)
