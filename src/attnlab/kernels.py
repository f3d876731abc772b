"""FlashAttention's forward pass as a Triton kernel, run on a CPU by its interpreter.

Read alongside: Dao 2023, "FlashAttention-2", Algorithm 1 (the forward pass, one program
per query block); Tillet et al. 2019, "Triton"; the Triton tutorial "Fused Attention".

Shapes as in :mod:`attnlab.attention`: q (b, h, n, d), k and v (b, h, m, d) (one
key/value head per query head). Glossary of the kernel's names: ``BLOCK_Q`` query rows
per program (B_r), ``BLOCK_K`` keys per inner step (B_c), ``D`` the head dimension.

Triton is optional (``pip install "attnlab[kernels]"``, Linux wheels only) and imported
on first use. On a machine without a CUDA GPU, :func:`load_triton` sets
``TRITON_INTERPRET=1`` *before* the import, so every kernel runs in Triton's
interpreter: NumPy executes each program one after another, slowly but exactly (float32
``tl.dot`` is full float32 there). The interpreter checks no bounds: a load without its
mask reads past the tensor and can crash the process, so run kernels you are still
writing in a subprocess (:func:`check_kernel_file` does, and checks the bounds itself).
On a GPU the same code is compiled; float32 products then default to TF32 unless
``input_precision="ieee"``, which :func:`triton_flash_attention` passes for float32
inputs (not run on a GPU in this repository's tests). :func:`check_kernel_file` always
uses the interpreter.
"""
from __future__ import annotations

import math
import os
import sys

import torch

from . import _checks

INSTALL_HINT = 'pip install "attnlab[kernels]"'
REQUIRE_FLAG = "ATTNLAB_REQUIRE_TRITON"  # =1: a missing Triton is an error, not a skip

triton = None  # set by load_triton(); the kernel body below reads `tl` from this module
tl = None
_compiled = None


def load_triton():
    """Import Triton (in interpreter mode when there is no CUDA GPU).

    Returns (triton, triton.language). Raises ImportError naming
    ``pip install "attnlab[kernels]"`` when Triton (or NumPy, which the interpreter
    needs) is missing. If something imported Triton earlier without the
    interpreter on a machine with no GPU, its Python modules are imported again in
    interpreter mode.
    """
    global triton, tl
    if triton is not None:
        return triton, tl
    if not torch.cuda.is_available():
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        if sys.modules.get("triton") is not None and not interpreted:
            # Something imported Triton first (torch.utils.flop_counter does, to see
            # whether it is installed). Triton's own library functions (tl.max,
            # tl.sum, ...) were then compiled-mode functions that the interpreter cannot
            # call, so import Triton's Python modules afresh; its native extension
            # (triton._C) is kept, and is the same.
            for name in [m for m in sys.modules
                         if (m == "triton" or m.startswith("triton."))
                         and not m.startswith("triton._C")]:
                del sys.modules[name]
        os.environ["TRITON_INTERPRET"] = "1"  # must precede the (first) `import triton`
    try:
        import triton as _triton
        import triton.language as _tl
    except ImportError as error:
        raise ImportError(f"attnlab.kernels needs Triton (Linux only): {INSTALL_HINT} "
                          f"({type(error).__name__}: {error})") from error
    triton, tl = _triton, _tl
    return triton, tl


def have_triton() -> bool:
    """True when Triton can be imported (see :func:`load_triton`).

    With the environment variable ``ATTNLAB_REQUIRE_TRITON=1`` (``make test`` sets it),
    a missing Triton raises the ImportError instead of returning False, so a test or a
    notebook section that would otherwise skip fails loudly.
    """
    try:
        load_triton()
    except ImportError:
        if os.environ.get(REQUIRE_FLAG) == "1":
            raise
        return False
    return True


def flash_forward_kernel(Q, K, V, O, L, n, m, scale,
                         D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                         CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    r"""One program: BLOCK_Q query rows of one (batch, head), FlashAttention-2 order.

    Q, O: (b·h, n, D) contiguous; K, V: (b·h, m, D); L: (b·h, n), the log-sum-exp per
    row. Streams the key blocks past the query block, keeping per row the running max m,
    the normaliser ℓ and the unnormalised output o on chip:

    .. math:: m' = \max(m, \mathrm{rowmax}\,S), \quad
              \ell' = e^{m - m'}\ell + \mathrm{rowsum}\,e^{S - m'}, \quad
              o' = e^{m - m'} o + e^{S - m'} V_j, \qquad O = o / \ell .

    Causal: bottom-right aligned, query i sees keys j ≤ i + m − n; key blocks wholly in
    the future of this query block are never loaded.
    """
    block = tl.program_id(0)                               # which query block
    bh = tl.program_id(1)                                  # which (batch, head)
    rows = block * BLOCK_Q + tl.arange(0, BLOCK_Q)         # (BLOCK_Q,) query indices
    dims = tl.arange(0, D)
    q_ptrs = Q + bh * n * D + rows[:, None] * D + dims[None, :]
    q = tl.load(q_ptrs, mask=rows[:, None] < n, other=0.0)     # (BLOCK_Q, D)

    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)   # running max
    l_i = tl.zeros([BLOCK_Q], tl.float32)                  # running normaliser
    acc = tl.zeros([BLOCK_Q, D], tl.float32)               # unnormalised output
    end = m
    if CAUSAL:                                             # last key a row here may see
        end = tl.minimum(m, (block + 1) * BLOCK_Q + m - n)
    for start in range(0, end, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)               # (BLOCK_K,) key indices
        kv_offsets = bh * m * D + cols[:, None] * D + dims[None, :]
        k = tl.load(K + kv_offsets, mask=cols[:, None] < m, other=0.0)  # (BLOCK_K, D)
        v = tl.load(V + kv_offsets, mask=cols[:, None] < m, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale   # (BQ, BK)
        keep = cols[None, :] < m                           # the ragged last block
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + (m - n))
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key seen yet
        alpha = tl.exp(m_i - m_safe)                       # rescales the old state
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)                # a row with no key: zeros
    o_ptrs = O + bh * n * D + rows[:, None] * D + dims[None, :]
    tl.store(o_ptrs, (acc / l_safe[:, None]).to(O.dtype.element_ty),
             mask=rows[:, None] < n)
    lse = tl.where(l_i == 0.0, float("inf"), m_i + tl.log(l_safe))
    tl.store(L + bh * n + rows, lse, mask=rows < n)


def _power_of_two(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def triton_flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
    block_q: int = 64, block_k: int = 64, scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Exact attention by :func:`flash_forward_kernel`: one Triton program per
    (query block, batch·head).

    .. math:: O = \mathrm{softmax}(QK^\top c)\,V, \quad c = 1/\sqrt{d}
              \text{ by default}

    Args:
        q: (b, h, n, d); k, v: (b, h, m, d); float32 or float16 (bfloat16 ``tl.dot`` is
            wrong in Triton's interpreter); d a power of two, at least 16. All on one
            device: the GPU when Triton compiles for it (a machine with CUDA), any
            device in the interpreter.
        causal: bottom-right aligned causal mask (query i sees keys j ≤ i + m − n).
        block_q, block_k: tile sizes, powers of two ≥ 16 (≥ 64 keeps the interpreter
            quick).
        scale: multiplies the scores; default 1/√d.
    Returns: (out (b, h, n, d) in q's dtype, lse (b, h, n) float32: the log-sum-exp per
        row, +inf for a row with no allowed key, whose output is 0).
    Raises: TypeError / ValueError naming the argument, before Triton is imported (a CPU
        tensor on a machine where Triton compiles for the GPU: after);
        ImportError naming ``pip install "attnlab[kernels]"`` when Triton is missing.
    """
    fn = "triton_flash_attention"
    _checks.floats(fn, q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{fn}: {name} must have shape (b, h, n, d), "
                             f"got {tuple(t.shape)}")
        if t.dtype not in (torch.float32, torch.float16):
            raise TypeError(f"{fn}: {name} must be float32 or float16, got {t.dtype}")
    b, h, n, d = q.shape
    if k.shape[:2] != (b, h) or k.shape[-1] != d:
        raise ValueError(f"{fn}: k must have shape ({b}, {h}, m, {d}) to match q "
                         f"{tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"{fn}: v must have k's shape {tuple(k.shape)}, "
                         f"got {tuple(v.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"{fn}: q, k and v must share a dtype, "
                        f"got {q.dtype}, {k.dtype}, {v.dtype}")
    if not k.device == v.device == q.device:
        raise ValueError(f"{fn}: q, k and v must be on one device, "
                         f"got {q.device}, {k.device}, {v.device}")
    if not (_power_of_two(d) and d >= 16):
        raise ValueError(f"{fn}: the head dimension d (q.shape[-1]) must be a power of "
                         f"two >= 16, got {d}")
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if not (isinstance(size, int) and _power_of_two(size) and size >= 16):
            raise ValueError(f"{fn}: {name} must be a power of two >= 16, got {size!r}")
    global _compiled
    triton, _ = load_triton()
    if os.environ.get("TRITON_INTERPRET") != "1" and q.device.type != "cuda":
        raise ValueError(f"{fn}: Triton compiles for the GPU here, so q, k and v must "
                         f"be on it (q.to('cuda'), ...), got device {q.device}")
    if _compiled is None:
        _compiled = triton.jit(flash_forward_kernel)
    m = k.shape[-2]
    q3, k3, v3 = (t.reshape(b * h, t.shape[-2], d).contiguous() for t in (q, k, v))
    out = torch.empty_like(q3)
    lse = torch.empty(b * h, n, dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    precision = "ieee" if q.dtype == torch.float32 else None
    grid = (triton.cdiv(n, block_q), b * h)
    _compiled[grid](q3, k3, v3, out, lse, n, m, scale, D=d, BLOCK_Q=block_q,
                    BLOCK_K=block_k, CAUSAL=bool(causal), PRECISION=precision)
    return out.reshape(b, h, n, d), lse.reshape(b, h, n)


# The cases a reader's kernel is checked on: (n, m, d, causal, block_q, block_k, b·h).
# Lengths that are not multiples of the tile, a bottom-right causal mask with n < m, one
# with n > m (its first queries see no key and must give zeros), three heads with n != m
# (a wrong head offset, `bh * n * D` for K, reads another head's keys), and tiles with
# BLOCK_Q != BLOCK_K.
CHECK_CASES = (
    (300, 300, 64, False, 64, 64, 1),
    (300, 300, 64, True, 64, 64, 1),
    (77, 130, 32, True, 64, 64, 1),
    (130, 77, 32, True, 64, 64, 1),
    (96, 80, 16, False, 64, 64, 3),
    (100, 100, 32, True, 32, 64, 1),
)

_RUNNER = r"""
import importlib.util, json, math, sys
import numpy as np
import torch, torch.nn.functional as F
from attnlab.kernels import load_triton
from attnlab.attention import causal_mask, scaled_dot_product_attention
from attnlab.numerics import agrees
triton, tl = load_triton()
from triton.runtime import interpreter
spec = importlib.util.spec_from_file_location("reader_kernel", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
# Bounds checks hook the interpreter's builder (as in Triton 3.7); a Triton without it
# runs the kernels unchecked, and a stray access shows as "crashed" instead.
builder, extents = getattr(interpreter, "interpreter_builder", None), {}


def bounded(op, what):
    def checked(ptrs, *args):
        mask = args[1] if what == "store" else args[0]
        wanted = ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape)]
        item = ptrs.get_element_ty().primitive_bitwidth // 8
        for name, (lo, hi) in extents.items():
            inside = (wanted >= lo) & (wanted + item <= hi)
            if inside.all():
                return op(ptrs, *args)
        raise IndexError(f"tl.{what} outside every tensor (a row or column past the "
                         f"end of {', '.join(extents)}): is its mask missing?")
    return checked


if hasattr(builder, "create_masked_load") and hasattr(builder, "create_masked_store"):
    builder.create_masked_load = bounded(builder.create_masked_load, "load")
    builder.create_masked_store = bounded(builder.create_masked_store, "store")
for (n, m, d, causal, bq, bk, bh), case in zip(*map(json.loads, sys.argv[2:4])):
    print(json.dumps({"case": case, "status": "started"}), flush=True)
    g = torch.Generator().manual_seed(n * 7 + m)
    q, k, v = (torch.randn(1, bh, r, d, generator=g) for r in (n, m, m))
    out = torch.full_like(q, float("nan"))
    extents.clear()
    for name, t in (("Q", q), ("K", k), ("V", v), ("O", out)):
        extents[name] = (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
    try:
        module.flash_kernel[(triton.cdiv(n, bq), bh)](q, k, v, out, n, m,
                                                      1 / math.sqrt(d), D=d, BLOCK_Q=bq,
                                                      BLOCK_K=bk, CAUSAL=causal)
    except Exception as error:                 # this case fails; the next ones run
        while error.__cause__ is not None or error.__context__ is not None:
            error = error.__cause__ or error.__context__
        detail = f"{type(error).__name__}: {error}".splitlines()[-1]
        print(json.dumps({"case": case, "status": "error", "detail": detail}),
              flush=True)
        continue
    mask = causal_mask(n, m) if causal else None
    exact = scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                         causal=causal)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).nan_to_num()
    ok = bool(torch.isfinite(out).all()) and agrees(out, theirs, exact,
                                                    scale=v.abs().max().item())
    error = (out.double() - exact).abs().max().item()
    status = "pass" if ok else "wrong"
    print(json.dumps({"case": case, "status": status, "error": error}), flush=True)
"""


def _case_name(case) -> str:
    n, m, d, causal, block_q, block_k, *rest = case
    heads = rest[0] if rest else 1
    return (f"n={n} m={m} d={d}" + (" causal" if causal else "")
            + (f" b·h={heads}" if heads != 1 else "")
            + (f" tiles {block_q}x{block_k}" if block_q != block_k else ""))


def _last_line(stderr: str) -> str:
    return (stderr.strip().splitlines() or ["(no message)"])[-1]


def check_kernel_file(path, cases=CHECK_CASES, *, timeout: float = 300) -> list[dict]:
    """Run a reader's kernel file against torch's SDPA in a fresh process, by case.

    The file must define ``flash_kernel`` (a ``@triton.jit`` function with the signature
    ``(Q, K, V, O, n, m, scale, D, BLOCK_Q, BLOCK_K, CAUSAL)``, Q and O of shape
    (b, h, n, D) contiguous, K and V (b, h, m, D)). A subprocess runs it in Triton's
    interpreter, on CPU tensors (also on a machine with a GPU). The interpreter itself
    checks no bounds, so the subprocess checks every ``tl.load`` and ``tl.store``: an
    address outside Q, K, V and O that the mask lets through is an error ("is its mask
    missing?"); and if the process dies all the same, this one survives.
    Placeholders left as ``x = ...  # STEP k`` are reported without running anything.
    ``cases``: tuples (n, m, d, causal, block_q, block_k[, b·h]), b·h 1 if left out.

    Returns one dict per case: ``case``, ``status`` ("pass", "wrong" (error above twice
    SDPA's, or NaN), "error" (an exception, an out-of-bounds access included: its last
    line in ``detail``), "crashed" (the process died), "not run" (an earlier case
    crashed), or "unfinished"), and ``error`` (max |out − exact|) when it ran.
    """
    import json
    import re
    import subprocess
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise ValueError("check_kernel_file: path must be an existing kernel file, "
                         f"got {str(path)!r}")
    if not cases:
        raise ValueError("check_kernel_file: cases must name at least one "
                         "(n, m, d, causal, block_q, block_k[, b·h])")
    full = [list(c) + [1] * (7 - len(c)) for c in cases]
    names = [_case_name(c) for c in full]
    todo = re.findall(r"=\s*\.\.\.\s*#\s*STEP\s*(\d+)", path.read_text())
    if todo:
        detail = "fill in STEP " + ", ".join(sorted(set(todo), key=int))
        return [{"case": name, "status": "unfinished", "detail": detail}
                for name in names]
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # always the interpreter, exact fp32
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(path), json.dumps(full), json.dumps(names)],
        capture_output=True, text=True, timeout=timeout, env=env)
    seen = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            seen[record["case"]] = record
    results = []
    for name in names:
        record = seen.get(name)
        if record is None:
            results.append({"case": name, "status": "not run"})
        elif record["status"] != "started":
            results.append(record)
        elif done.returncode < 0 or done.returncode > 128:
            results.append({"case": name, "status": "crashed",
                            "detail": f"exit code {done.returncode}: probably an "
                                      "unmasked load or store outside a tensor"})
        else:
            results.append({"case": name, "status": "error",
                            "detail": _last_line(done.stderr)})
    if not seen and done.returncode != 0:  # failed before the first case (syntax error)
        results = [{"case": name, "status": "error", "detail": _last_line(done.stderr)}
                   for name in names]
    return results
