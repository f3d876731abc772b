"""Speculative decoding with the shipped chapter-4 pair, measured for γ = 1 … 6 at one thread.

Chapter 14 runs one small case live; this command measures the whole range. The pair is the
shipped ``target`` and ``draft`` micro-GPTs (:func:`attnlab.experiments.microgpt.load_pretrained`).
``PROMPTS`` windows of ``PROMPT_LEN`` characters from the validation text are each continued by
``NEW_TOKENS`` characters (prompt + new tokens fit the models' 64 positions), at temperature 1.

For every γ the run records, summed over the prompts and ``SEEDS`` seeds:
the drafts accepted and rejected (α = accepted / examined), the target passes ("steps"), the
tokens per target pass, the CPU time spent inside the target's and the draft's forward calls
during speculative sampling (the rest is the verify step and Python), the CPU time inside the
target's calls during plain sampling (the rest is its own sampling and Python), and the time of
speculative sampling against plain sampling from the target, both without a KV cache
(``speculative_generate`` is run with ``use_cache=False``). The same quantities are stored per seed (``"per_seed"``). Time is measured twice:
wall time, and the CPU time of the decoding thread (``time.thread_time``), which a busy
machine does not inflate. The ``"pair"`` point records the cost ratio c (draft forward time /
target forward time at the lengths decoding uses), the models' validation losses, and the
expected acceptance β = Σ_x min(p(x), q(x)) at held-out positions (mean and quantiles),
whose spread is why a single α does not describe every step.

    python -m attnlab.experiments.speculative_bench --smoke     # seconds, writes nothing
    python -m attnlab.experiments.speculative_bench             # about three minutes at one thread

Writes ``attnlab/data/speculative_bench.json`` after every point; ``--resume`` skips the
points already there. It runs at one torch thread.
"""
from __future__ import annotations

import argparse
import sys
import time
from importlib import resources
from pathlib import Path

import torch

from ..bench import format_table
from ..models import generate
from ..speculative import acceptance_rate, expected_speedup, expected_tokens_per_step, speculative_generate
from . import _sweep
from .microgpt import load_pretrained

DATA_FILE = "speculative_bench.json"
COMMAND = "python -m attnlab.experiments.speculative_bench"
PROMPTS, PROMPT_LEN, NEW_TOKENS, SEEDS = 12, 8, 48, 3
GAMMAS = (1, 2, 3, 4, 5, 6)


def prompts(corpus, count: int = PROMPTS, length: int = PROMPT_LEN) -> list[torch.Tensor]:
    """``count`` (1, length) prompts cut from the validation text at fixed, evenly spaced places."""
    ids = corpus.val_ids
    starts = torch.linspace(0, len(ids) - length - 1, count).long().tolist()
    return [ids[s:s + length].unsqueeze(0) for s in starts]


class Clocked:
    """A model wrapper that adds up the calls and the thread CPU time spent inside them."""

    def __init__(self, model):
        self.model, self.calls, self.cpu = model, 0, 0.0

    def __getattr__(self, name):                 # config, eval(), train(), ... of the model
        return getattr(self.model, name)

    def __call__(self, ids, **kwargs):
        start = time.thread_time()
        out = self.model(ids, **kwargs)
        self.cpu += time.thread_time() - start
        self.calls += 1
        return out


def _timed(fn):
    wall, cpu = time.perf_counter(), time.thread_time()
    out = fn()
    return out, time.perf_counter() - wall, time.thread_time() - cpu


@torch.no_grad()
def measure_pair(target, draft, corpus, *, windows: int = 64, repeats: int = 30) -> dict:
    """c = draft / target forward time at the decoding lengths, and β at held-out positions."""
    x, _ = corpus.batch(windows, 63, split="val", generator=torch.Generator().manual_seed(1))
    beta = acceptance_rate(torch.softmax(target(x), -1), torch.softmax(draft(x), -1)).flatten()
    lengths = range(PROMPT_LEN, PROMPT_LEN + NEW_TOKENS, 4)
    times = {}
    for name, model in (("target", target), ("draft", draft)):
        for L in lengths:                                            # warm-up
            model(x[:1, :L])
        best_wall, best_cpu = [], []
        for _ in range(3):
            _, w, c = _timed(lambda: [model(x[:1, :L]) for L in lengths for _ in range(repeats)])
            best_wall.append(w)
            best_cpu.append(c)
        times[name] = (min(best_wall), min(best_cpu))
    qs = torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9])
    return {"point": "pair", "cost_ratio_wall": times["draft"][0] / times["target"][0],
            "cost_ratio_cpu": times["draft"][1] / times["target"][1],
            "target_parameters": sum(p.numel() for p in target.parameters()),
            "draft_parameters": sum(p.numel() for p in draft.parameters()),
            "beta_mean": beta.mean().item(), "beta_quantiles": dict(zip(qs.tolist(), beta.quantile(qs).tolist())),
            "beta_positions": beta.numel()}


@torch.no_grad()
def run_gamma(target, draft, corpus, gamma: int, *, n_prompts: int = PROMPTS, seeds: int = SEEDS,
              new_tokens: int = NEW_TOKENS) -> dict:
    """Counts and times of speculative sampling with ``gamma`` drafts against plain sampling.

    Totals over all seeds, and the same quantities per seed under ``"per_seed"`` (each seed
    continues every prompt once), so that the spread over seeds can be shown.
    """
    keys = ("steps", "accepted", "rejected", "tokens", "plain_wall_s", "spec_wall_s", "plain_cpu_s",
            "spec_cpu_s", "spec_target_cpu_s", "spec_draft_cpu_s", "plain_target_cpu_s",
            "target_calls", "draft_calls", "plain_target_calls")
    per_seed = []
    for seed in range(seeds):
        row = dict.fromkeys(keys, 0)
        clocked_target, clocked_draft, clocked_plain = Clocked(target), Clocked(draft), Clocked(target)
        for i, prompt in enumerate(prompts(corpus, n_prompts)):
            g = torch.Generator().manual_seed(1000 * seed + i)
            (_, stats), w, c = _timed(lambda: speculative_generate(clocked_target, clocked_draft, prompt, new_tokens,
                                                                   gamma=gamma,
                                                                   generator=g))
            row["spec_wall_s"] += w
            row["spec_cpu_s"] += c
            for key in ("steps", "accepted", "rejected"):
                row[key] += stats[key]
            row["tokens"] += new_tokens
            gp = torch.Generator().manual_seed(1000 * seed + i)
            _, w, c = _timed(lambda: generate(clocked_plain, prompt, new_tokens, use_cache=False, generator=gp))
            row["plain_wall_s"] += w
            row["plain_cpu_s"] += c
        row.update(spec_target_cpu_s=clocked_target.cpu, spec_draft_cpu_s=clocked_draft.cpu,
                   plain_target_cpu_s=clocked_plain.cpu, target_calls=clocked_target.calls,
                   draft_calls=clocked_draft.calls, plain_target_calls=clocked_plain.calls)
        row["alpha"] = row["accepted"] / max(row["accepted"] + row["rejected"], 1)
        row["speedup_cpu"] = row["plain_cpu_s"] / row["spec_cpu_s"]
        row["speedup_wall"] = row["plain_wall_s"] / row["spec_wall_s"]
        per_seed.append(row)
    totals = {key: sum(r[key] for r in per_seed) for key in keys}
    alpha = totals["accepted"] / max(totals["accepted"] + totals["rejected"], 1)
    return {"point": f"gamma={gamma}", "gamma": gamma, **totals, "alpha": alpha,
            "tokens_per_pass": totals["tokens"] / totals["steps"],
            "formula_tokens_per_pass": expected_tokens_per_step(alpha, gamma),
            "speedup_wall": totals["plain_wall_s"] / totals["spec_wall_s"],
            "speedup_cpu": totals["plain_cpu_s"] / totals["spec_cpu_s"],
            "cost_ratio_in_run": (totals["spec_draft_cpu_s"] / totals["draft_calls"])
            / (totals["spec_target_cpu_s"] / totals["target_calls"]),
            "per_seed": per_seed}


def summary(data: dict) -> list[dict]:
    """One row per γ: measured α, tokens per pass, speed-ups, and the formula's predictions."""
    pair = next(p for p in data["points"] if p["point"] == "pair")
    rows = []
    for p in sorted((p for p in data["points"] if p["point"] != "pair"), key=lambda p: p["gamma"]):
        rows.append({"γ": p["gamma"], "α": p["alpha"], "tokens / pass": p["tokens_per_pass"],
                     "formula": p["formula_tokens_per_pass"],
                     "speed-up (CPU time)": p["speedup_cpu"],
                     "seed min": min((r["speedup_cpu"] for r in p.get("per_seed", [])), default=float("nan")),
                     "seed max": max((r["speedup_cpu"] for r in p.get("per_seed", [])), default=float("nan")),
                     "speed-up (wall)": p["speedup_wall"],
                     "predicted, measured c": expected_speedup(p["alpha"], p["gamma"], pair["cost_ratio_cpu"])})
    return rows


def load() -> dict:
    """The shipped measurement."""
    return _sweep.load_data(DATA_FILE)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="γ = 1, 2 on 2 prompts, one seed; writes nothing")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    target, corpus = load_pretrained("target")
    draft, _ = load_pretrained("draft")
    head = _sweep.header(COMMAND, prompts=PROMPTS, prompt_len=PROMPT_LEN, new_tokens=NEW_TOKENS, seeds=SEEDS,
                         threads=torch.get_num_threads(), kv_cache=False)
    if args.smoke:
        points = [measure_pair(target, draft, corpus, windows=8, repeats=2),
                  run_gamma(target, draft, corpus, 1, n_prompts=2, seeds=1),
                  run_gamma(target, draft, corpus, 2, n_prompts=2, seeds=1)]
        print(format_table(summary({"points": points}), floatfmt=".3f"))
        return 0
    out = args.out
    if out is None:
        with resources.as_file(resources.files("attnlab").joinpath("data", DATA_FILE)) as p:
            out = Path(p)

    def run_point(point):
        if point == "pair":
            return measure_pair(target, draft, corpus)
        return run_gamma(target, draft, corpus, int(point.split("=")[1]))

    data = _sweep.run_points(["pair", *(f"gamma={g}" for g in GAMMAS)], run_point,
                             key=lambda p: p if isinstance(p, str) else p["point"], head=head, out=out,
                             resume=args.resume, indent=1, desc="speculative")
    print(format_table(summary(data), floatfmt=".3f"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
