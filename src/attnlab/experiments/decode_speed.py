"""Greedy decoding with and without a KV cache, timed step by step up to 1,024 new tokens.

Chapter 5 times a short run live (256 new tokens); this command times the long one, which at
one thread takes several minutes without the cache. One randomly initialised ``MicroGPT``
(2 layers, d_model = 384, 6 heads, max_len = 1,152; trained weights change no time, so none are
used) decodes 1,024 tokens greedily after a 16-token prompt in four forms:

* ``cached``: the library's ``MicroGPT.forward`` with a :class:`~attnlab.kv_cache.KVCache`;
* ``uncached``: the library's forward over all tokens so far at every step. Its attention is
  written out (:func:`attnlab.attention.scaled_dot_product_attention`): it materialises the
  t x t scores, the mask and the weights in every layer;
* ``uncached, fused``: the same weights through :func:`fused_forward`, whose attention is
  ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``, a fused kernel that keeps
  no t x t matrix in memory, and whose LM head runs on the last position only (the fair
  baseline: what an inference loop without a cache, such as nanoGPT's, does);
* ``cached, fused``: :func:`fused_forward` with the cache.

It also times cached decoding with ``n_kv_heads`` = 2 and 1 (GQA and MQA; 6 is the model above),
both through the library (whose ``repeat_kv`` copies each cached head h / h_kv times at every
step) and through :func:`fused_forward` (which folds a group's query heads into rows and reads the
shared head in place). Each run is repeated ``--repeats`` times, the forms alternating within a
repeat. Every step is timed, so the total for any T <= 1,024 new tokens is the sum of the first
T steps. Runs of one model must write identical token ids.

Each step is timed twice: wall time, and the CPU time of the decoding thread
(``time.thread_time``). At one torch thread every operation runs in that thread, so its CPU
time is the work done. It is much less inflated than wall time when other processes share the
machine (waiting for a core is not counted), though not immune: a busy sibling hyperthread or
shared cache and memory bandwidth still slow the work itself.

    python -m attnlab.experiments.decode_speed --smoke      # seconds: 32 tokens, writes nothing
    python -m attnlab.experiments.decode_speed              # ~25 minutes at one thread (shared machine)

The run writes ``attnlab/data/decode_speed.json`` after every run and ``--resume`` skips the
ones already there. It runs at one torch thread.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F

from ..attention import repeat_kv
from ..bench import format_table
from ..kv_cache import KVCache
from ..models import GPTConfig, MicroGPT
from . import _sweep

DATA_FILE = "decode_speed.json"
CONFIG = GPTConfig(vocab_size=128, max_len=1152, n_layers=2, d_model=384, n_heads=6)
PROMPT_LEN, NEW_TOKENS, SEED = 16, 1024, 0
REPORT_AT = (16, 64, 256, 512, 1024)
FORMS = ("cached", "uncached", "uncached, fused", "cached, fused")
KV_HEADS = (6, 2, 1)
GQA_FORMS = ("cached", "cached, fused")


@dataclass(frozen=True)
class Point:
    """One timed decoding run: a form of the loop, on the model with ``n_kv_heads`` KV heads."""

    repeat: int
    form: str
    n_kv_heads: int = 6
    new_tokens: int = NEW_TOKENS


def chapter_model(config: GPTConfig = CONFIG, seed: int = SEED, n_kv_heads: int | None = None) -> MicroGPT:
    """The chapter's randomly initialised model, in eval mode (optionally with fewer KV heads)."""
    if n_kv_heads is not None and n_kv_heads != config.n_heads:
        config = replace(config, n_kv_heads=n_kv_heads)
    torch.manual_seed(seed)
    return MicroGPT(config).eval()


def chapter_prompt(length: int = PROMPT_LEN, vocab: int = CONFIG.vocab_size, seed: int = SEED) -> torch.Tensor:
    """A (1, length) prompt of random token ids."""
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def fused_forward(model: MicroGPT, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
    r"""``model``'s forward with fused attention: logits of the last position only, (b, 1, V).

    Same weights and layers as :meth:`MicroGPT.forward`, but each layer's attention is
    ``F.scaled_dot_product_attention``, which computes
    :math:`\mathrm{softmax}(QK^\top/\sqrt d + M)V` without writing the (n, m) scores or
    weights to memory. Over n > 1 tokens (no cache, or the prefill into an empty ``cache``) it
    uses ``is_causal=True``. A decoding step (n = 1, keys from ``cache``) folds the
    g = h / h_kv query heads of a group into g rows, (b, h, 1, d) -> (b, h_kv, g, d), so each
    shared key/value head is read in place: no ``repeat_kv`` copy.
    """
    start = 0 if cache is None else cache.length
    b, n = idx.shape
    if n > 1 and start:
        raise ValueError(f"fused_forward takes several tokens only into an empty cache, "
                         f"got {n} tokens after {start} cached positions")
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(start, start + n, device=idx.device))
    for i, block in enumerate(model.blocks):
        a, h = block.attn, block.norm1(x)
        q = a.split_heads(a.q_proj(h), a.n_heads)                       # (b, h, n, d)
        k, v = a.context_kv(h)                                         # (b, h_kv, n, d)
        if cache is not None:
            k, v = cache[i].append(k, v)                               # (b, h_kv, t, d)
        g = a.n_heads // a.n_kv_heads
        if n == 1:
            rows = q.reshape(b, a.n_kv_heads, g, a.head_dim)           # a group's heads as rows
            o = F.scaled_dot_product_attention(rows, k, v).reshape(b, a.n_heads, 1, a.head_dim)
        else:
            o = F.scaled_dot_product_attention(q, repeat_kv(k, g), repeat_kv(v, g), is_causal=True)
        x = x + a.out_proj(a.merge_heads(o))
        x = x + block.ffn(block.norm2(x))
    return model.lm_head(model.norm_f(x[:, -1:]))


@torch.no_grad()
def timed_decode(model: MicroGPT, prompt: torch.Tensor, new_tokens: int, *, cached: bool,
                 fused: bool = False):
    """Greedy decoding that times each step: (ids (b, L + T), wall seconds, CPU seconds).

    The CPU seconds are the calling thread's (``time.thread_time``), which at one torch thread
    is all the work. Step 0 includes the prefill (the whole prompt in one pass) when
    ``cached``; without the cache every step runs the model over all tokens so far. ``fused``
    runs :func:`fused_forward` instead of the library's forward.
    """
    idx, cache, seconds, cpu = prompt, None, [], []
    if cached:
        cache = model.new_cache(prompt.shape[0], prompt.shape[1] + new_tokens)
    step_input = prompt
    for _ in range(new_tokens):
        start, start_cpu = time.perf_counter(), time.thread_time()
        tokens = step_input if cached else idx
        logits = fused_forward(model, tokens, cache) if fused else model(tokens, cache=cache)
        next_id = logits[:, -1].argmax(dim=-1, keepdim=True)
        cpu.append(time.thread_time() - start_cpu)
        seconds.append(time.perf_counter() - start)
        idx = torch.cat([idx, next_id], dim=1)
        step_input = next_id
    return idx, seconds, cpu


def run_point(point: Point) -> dict:
    torch.set_num_threads(1)
    model, prompt = chapter_model(n_kv_heads=point.n_kv_heads), chapter_prompt()
    kind = {"cached": point.form.startswith("cached"), "fused": point.form.endswith("fused")}
    timed_decode(model, prompt, 8, **kind)                         # warm-up
    ids, seconds, cpu = timed_decode(model, prompt, point.new_tokens, **kind)
    return {**asdict(point), "step_ms": [round(1e3 * s, 4) for s in seconds],
            "cpu_ms": [round(1e3 * s, 4) for s in cpu], "ids": ids[0].tolist()}


def median_steps(points: list[dict], form: str, key: str = "cpu_ms", n_kv_heads: int = 6) -> list[float]:
    """Each step's time (ms), the median over the runs of one form; key "cpu_ms" or "step_ms" (wall)."""
    runs = [p[key] for p in points if p["form"] == form and p.get("n_kv_heads", 6) == n_kv_heads]
    return [statistics.median(s) for s in zip(*runs)]


SHORT = {"cached": "cached", "uncached": "uncached", "uncached, fused": "fused uncached",
         "cached, fused": "fused cached"}


def summary_rows(points: list[dict], at=REPORT_AT, key: str = "cpu_ms") -> list[dict]:
    """Seconds for the first T steps (CPU time, or wall with key="step_ms"), each step the median
    over the runs of its form, and the cached loop's speed-up against each uncached baseline
    present: "speed-up" against the library's uncached loop, "vs fused" against the fused one."""
    forms = [f for f in FORMS if any(p["form"] == f and p.get("n_kv_heads", 6) == 6 for p in points)]
    steps = {f: median_steps(points, f, key) for f in forms}
    rows = []
    for T in at:
        if T > min(len(s) for s in steps.values()):
            continue
        row = {"new tokens": T, **{f"{SHORT[f]} s": sum(steps[f][:T]) / 1e3 for f in forms}}
        if "uncached" in steps:
            row["speed-up"] = row["uncached s"] / row["cached s"]
        if "uncached, fused" in steps:
            row["vs fused"] = row["fused uncached s"] / row["cached s"]
        rows.append(row)
    return rows


def kv_head_rows(points: list[dict], at: int = NEW_TOKENS, key: str = "cpu_ms") -> list[dict]:
    """Cached decoding with 6, 2 and 1 KV heads: mean ms per step over the last 64 of the first
    ``at`` new tokens (t near prompt + ``at``), through the library (repeat_kv copies the cache)
    and through :func:`fused_forward` (no copy), each step the median over runs."""
    rows = []
    for h_kv in KV_HEADS:
        row = {"KV heads": h_kv}
        for form in GQA_FORMS:
            steps = median_steps(points, form, key, n_kv_heads=h_kv)
            if len(steps) >= at:
                row[f"{SHORT[form]} ms/step"] = statistics.mean(steps[max(1, at - 64):at])
        rows.append(row)
    return rows


def same_ids(points: list[dict], n_kv_heads: int = 6, forms=FORMS) -> bool:
    """Every run of the model with ``n_kv_heads`` KV heads, in any of ``forms``, wrote the same ids."""
    return len({tuple(p["ids"]) for p in points
                if p.get("n_kv_heads", 6) == n_kv_heads and p["form"] in forms}) == 1


def load() -> dict:
    """The shipped run (``attnlab/data/decode_speed.json``)."""
    return _sweep.load_data(DATA_FILE)


def all_points(repeats: int, new_tokens: int = NEW_TOKENS) -> list[Point]:
    """Every run, in the order they are made: within a repeat, all forms and models in turn."""
    return [Point(r, form, h_kv, new_tokens) for r in range(repeats) for h_kv in KV_HEADS
            for form in (FORMS if h_kv == 6 else GQA_FORMS)]


def _key(p):
    return (p.repeat, p.form, p.n_kv_heads) if isinstance(p, Point) else (p["repeat"], p["form"], p["n_kv_heads"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="32 new tokens, one repeat; writes nothing")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --out")
    parser.add_argument("--out", type=Path, default=Path(str(resources.files("attnlab").joinpath("data", DATA_FILE))))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.smoke:
        result = _sweep.run_points(all_points(1, 32), run_point, key=_key, head={}, progress=False)
        print(format_table(summary_rows(result["points"], at=(8, 32)), floatfmt=".3g"))
        print(format_table(kv_head_rows(result["points"], at=32), floatfmt=".3g"))
        print("same ids:", all(same_ids(result["points"], h) for h in KV_HEADS))
        return
    command = "python -m attnlab.experiments.decode_speed" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    head = _sweep.header(command, threads=torch.get_num_threads(), config=asdict(CONFIG),
                         prompt_len=PROMPT_LEN, new_tokens=NEW_TOKENS, seed=SEED, kv_heads=list(KV_HEADS))
    result = _sweep.run_points(all_points(args.repeats), run_point, key=_key, head=head, out=args.out,
                               resume=args.resume, sort=lambda r: (r["n_kv_heads"] != 6, r["n_kv_heads"] * -1,
                                                                   FORMS.index(r["form"]), r["repeat"]),
                               desc="decode_speed")
    print(format_table(summary_rows(result["points"]), floatfmt=".3g"))
    print(format_table(kv_head_rows(result["points"]), floatfmt=".3g"))
    print("same ids:", {h: same_ids(result["points"], h) for h in KV_HEADS})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
