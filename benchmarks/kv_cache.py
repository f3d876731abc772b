"""Greedy decoding with and without a KV cache: time per run and speed-up against new tokens.

usage: python benchmarks/kv_cache.py [--new-tokens 16 64 128 256 512] [--layers 2] [--d-model 384]
                                     [--heads 6] [--prompt 16] [--repeats 3] [--threads 1] [--device cpu]

Both forms run the same randomly initialised MicroGPT (by default chapter 5's shape: 2 layers,
d_model 384, 6 heads) on the same prompt in the same run, alternating (after one warm-up each),
and the medians are compared; the speed-up (uncached time / cached time) is what counts. Times
are wall time and the CPU time of the decoding thread, which a machine busy with other work does
not stretch. Each row also checks that the two forms produced identical token ids. The shipped
step-by-step run up to 1,024 new tokens is ``python -m attnlab.experiments.decode_speed``; this
script prints totals per run, a similar table, not the same one. It runs at one torch thread on
the CPU unless ``--threads`` and ``--device`` say otherwise.
"""
import argparse
import statistics
import time

import torch

from attnlab.bench import format_table, loglog_slope, time_fn
from attnlab.models import GPTConfig, MicroGPT, generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[16, 64, 128, 256, 512])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = args.device
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=128, max_len=args.prompt + max(args.new_tokens), n_layers=args.layers,
                       d_model=args.d_model, n_heads=args.heads)
    model = MicroGPT(config).to(device).eval()
    prompt = torch.randint(0, 128, (1, args.prompt), generator=torch.Generator().manual_seed(0)).to(device)
    rows = []
    for new in args.new_tokens:
        ids = {c: generate(model, prompt, new, use_cache=c, greedy=True) for c in (True, False)}
        runs, cpu = {True: [], False: []}, {True: [], False: []}
        for _ in range(args.repeats):  # alternate the two forms so that a change in load hits both
            for c in (True, False):
                start = time.thread_time()
                runs[c].append(time_fn(lambda c=c: generate(model, prompt, new, use_cache=c, greedy=True),
                                       warmup=0, repeats=1))
                cpu[c].append(time.thread_time() - start)
        times = {c: statistics.median(runs[c]) for c in runs}
        cpus = {c: statistics.median(cpu[c]) for c in cpu}
        rows.append({"new tokens": new, "uncached ms": 1e3 * times[False], "cached ms": 1e3 * times[True],
                     "speed-up": times[False] / times[True], "speed-up (CPU)": cpus[False] / cpus[True],
                     "same ids": torch.equal(ids[True], ids[False])})
    print(f"greedy decoding, MicroGPT {args.layers} layers, d_model={args.d_model}, {args.heads} heads, "
          f"prompt {args.prompt}, {device}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(format_table(rows, floatfmt=".3g"))
    news = [r["new tokens"] for r in rows]
    if len(news) > 1:
        print(f"log-log time slope: uncached {loglog_slope(news, [r['uncached ms'] for r in rows]):.2f}, "
              f"cached {loglog_slope(news, [r['cached ms'] for r in rows]):.2f}")


if __name__ == "__main__":
    main()
