"""Greedy decoding with and without a KV cache: time per run and speed-up against new tokens.

usage: python benchmarks/kv_cache.py [--new-tokens 16 64 128 256 512] [--layers 2] [--d-model 128]
                                     [--heads 4] [--prompt 16] [--repeats 3]

Both forms run the same randomly initialised MicroGPT on the same prompt in the same run,
alternating (after one warm-up each), and the medians are compared; the speed-up (uncached
time / cached time) is what counts. Each row also checks that the
two forms produced identical token ids.
"""
import argparse
import statistics

import torch

from attnlab.bench import format_table, loglog_slope, time_fn
from attnlab.models import GPTConfig, MicroGPT, generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[16, 64, 128, 256, 512])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=128, max_len=args.prompt + max(args.new_tokens), n_layers=args.layers,
                       d_model=args.d_model, n_heads=args.heads)
    model = MicroGPT(config).to(device).eval()
    prompt = torch.randint(0, 128, (1, args.prompt), generator=torch.Generator().manual_seed(0)).to(device)
    rows = []
    for new in args.new_tokens:
        ids = {c: generate(model, prompt, new, use_cache=c, greedy=True) for c in (True, False)}
        runs = {True: [], False: []}
        for _ in range(args.repeats):  # alternate the two forms so that a change in load hits both
            for c in (True, False):
                runs[c].append(time_fn(lambda c=c: generate(model, prompt, new, use_cache=c, greedy=True),
                                       warmup=0, repeats=1))
        times = {c: statistics.median(runs[c]) for c in runs}
        rows.append({"new tokens": new, "uncached ms": 1e3 * times[False], "cached ms": 1e3 * times[True],
                     "speed-up": times[False] / times[True], "same ids": torch.equal(ids[True], ids[False])})
    print(f"greedy decoding, MicroGPT {args.layers} layers, d_model={args.d_model}, {args.heads} heads, "
          f"prompt {args.prompt}, {device}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(format_table(rows, floatfmt=".3g"))
    news = [r["new tokens"] for r in rows]
    if len(news) > 1:
        print(f"log-log time slope: uncached {loglog_slope(news, [r['uncached ms'] for r in rows]):.2f}, "
              f"cached {loglog_slope(news, [r['cached ms'] for r in rows]):.2f}")


if __name__ == "__main__":
    main()
