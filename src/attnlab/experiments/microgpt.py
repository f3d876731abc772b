"""Train the two character-level MicroGPTs the book ships: a ``target`` and a smaller ``draft``.

Both read the cleaned pydoc text (:func:`attnlab.tasks.char_corpus` with ``clean=True``: the
CPython 3.11.7 snapshot shipped in ``attnlab/data/``, heading underlines and table borders
removed), in windows of 64 characters, and train with :func:`attnlab.train`'s recipe written out
as a resumable loop: AdamW (betas 0.9, 0.95, weight decay 0.1 on matrices), linear warmup then
cosine decay to a tenth of the peak learning rate, gradient clipping at 1, and dropout. The
target is 4 layers of width 192 (dropout 0.2, peak rate 2e-3, 5,000 steps), the draft 2 layers of
width 96 (dropout 0.1, peak rate 3e-3, 3,000 steps). Dropout because without it a longer run
overfits the 404k training characters (a 6,000-step 3 x 128 run without dropout: training loss
0.65 at the end, validation loss rising from 1.44 at step 2,750 to 1.61). Every ``eval_every``
steps the run records the validation loss on fixed windows of the last 10% of the text (never
trained on, and not used to pick anything: the step count is fixed in advance) and the mean
attention entropy of every layer on those windows. Chapter 4 shows the target's samples and
curves; chapter 14 uses the pair for speculative decoding.

``--ladder`` runs chapter 4's comparison instead: a counted bigram (add-alpha smoothing, alpha
picked on the first half of the validation text) and three learned models (one causal head,
MicroGPT with 1 and 2 layers, width 64), each at peak learning rates 3e-3, 1e-2, 3e-2 from seeds
0, 1, 2, with one shared recipe (:func:`run_ladder_point`). The rate is selected per model on the
first half of the validation text ("selection"); the loss reported is on the second ("test").

    python -m attnlab.experiments.microgpt --threads 2     # both sizes, as shipped: ~50 minutes
    python -m attnlab.experiments.microgpt --size draft    # one of them (one thread unless --threads)
    python -m attnlab.experiments.microgpt --smoke         # seconds: a few steps, nothing shipped
    python -m attnlab.experiments.microgpt --ladder        # chapter 4's ladder, ~4 CPU minutes

A checkpoint is written every ``--checkpoint-every`` steps under ``--work`` (default
``~/.cache/attnlab/microgpt``) and ``--resume`` continues from it. At the end the weights
(fp16 state_dict, with the config and the vocabulary) go to ``attnlab/data/microgpt_<size>.pt``
and the training log to ``attnlab/data/microgpt_<size>.json``. Load them with
:func:`load_pretrained`.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F

from torch import nn

from ..attention import MultiHeadAttention, attention_entropy
from ..models import GPTConfig, MicroGPT
from ..schedules import warmup_cosine_lr
from ..tasks import CharCorpus, char_corpus
from ..train import train
from . import _sweep


@dataclass(frozen=True)
class RunConfig:
    """One shipped model: its shape and its training recipe."""

    n_layers: int
    d_model: int
    n_heads: int
    max_len: int = 64
    batch: int = 32
    steps: int = 1200
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.1
    eval_every: int = 100
    eval_windows: int = 128
    seed: int = 0
    dropout: float = 0.0

    def gpt_config(self, vocab_size: int) -> GPTConfig:
        return GPTConfig(vocab_size=vocab_size, max_len=self.max_len, n_layers=self.n_layers,
                         d_model=self.d_model, n_heads=self.n_heads, dropout=self.dropout)


SIZES = {
    "target": RunConfig(n_layers=4, d_model=192, n_heads=6, steps=5000, lr=2e-3, eval_every=250, dropout=0.2),
    "draft": RunConfig(n_layers=2, d_model=96, n_heads=4, steps=3000, eval_every=250, dropout=0.1),
}


def corpus() -> CharCorpus:
    """The text both models read: the shipped pydoc snapshot without markup-only lines."""
    return char_corpus(clean=True)


def validation_windows(data: CharCorpus, run: RunConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed windows of the validation text: inputs and targets, each (eval_windows, max_len)."""
    return data.batch(run.eval_windows, run.max_len, split="val", generator=torch.Generator().manual_seed(1234))


@torch.no_grad()
def evaluate(model: MicroGPT, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Validation loss (nats per character) and each layer's mean attention entropy (nats)."""
    was_training = model.training
    model.eval()
    logits, weights = model(x, return_weights=True)
    model.train(was_training)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    return {"val_loss": loss, "layer_entropy": [attention_entropy(w).mean().item() for w in weights]}


def _optimizer(model: MicroGPT, run: RunConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": run.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=run.lr, betas=(0.9, 0.95))


def train_size(size: str, run: RunConfig, *, work: Path, resume: bool = False, checkpoint_every: int = 100,
               stop_after: int | None = None, progress: bool = True) -> tuple[MicroGPT, dict]:
    """Train one model (resuming from ``work/<size>.ckpt`` if asked) and return it with its log.

    ``stop_after`` ends this call after that many steps (with a checkpoint), as an interruption
    would; a later call with ``resume=True`` continues exactly where it stopped.
    """
    data = corpus()
    torch.manual_seed(run.seed)
    model = MicroGPT(run.gpt_config(data.vocab_size))
    optimizer = _optimizer(model, run)
    data_gen = torch.Generator().manual_seed(run.seed)
    log = {"steps": [], "train_loss": [], "evals": []}
    start, seconds = 0, 0.0
    ckpt = work / f"{size}.ckpt"
    if resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        if state["run"] != asdict(run):
            raise ValueError(f"{ckpt} was written for {state['run']}, not {asdict(run)}; delete it or drop --resume")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        data_gen.set_state(state["data_gen"])
        torch.set_rng_state(state["torch_rng"])
        log, start, seconds = state["log"], state["step"], state["seconds"]
    val_x, val_y = validation_windows(data, run)
    if start == 0:
        log["evals"].append({"step": 0, **evaluate(model, val_x, val_y)})
    from tqdm.auto import tqdm

    bar = tqdm(total=run.steps, initial=start, desc=size, disable=not progress)
    model.train()
    t0 = time.perf_counter()
    last = run.steps if stop_after is None else min(run.steps, start + stop_after)
    for step in range(start + 1, last + 1):
        lr = warmup_cosine_lr(step, peak=run.lr, warmup=run.warmup, total=run.steps, final=0.1 * run.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = data.batch(run.batch, run.max_len, generator=data_gen)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        log["steps"].append(step)
        log["train_loss"].append(round(loss.item(), 4))
        bar.update(1)
        if step % run.eval_every == 0 or step == run.steps:
            log["evals"].append({"step": step, **evaluate(model, val_x, val_y)})
            bar.set_postfix(val=f"{log['evals'][-1]['val_loss']:.3f}", refresh=False)
        if step % checkpoint_every == 0 or step == last:
            work.mkdir(parents=True, exist_ok=True)
            elapsed = seconds + time.perf_counter() - t0
            torch.save({"run": asdict(run), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "data_gen": data_gen.get_state(), "torch_rng": torch.get_rng_state(), "log": log,
                        "step": step, "seconds": elapsed}, ckpt)
    bar.close()
    log["train_seconds"] = round(seconds + time.perf_counter() - t0, 1)
    model.eval()
    return model, log


def save_pretrained(size: str, model: MicroGPT, data: CharCorpus, run: RunConfig, log: dict, command: str,
                    directory: Path) -> None:
    """Write ``microgpt_<size>.pt`` (fp16 weights, config, vocabulary) and ``microgpt_<size>.json`` (log)."""
    state = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    # the tied output matrix is the embedding: store it once
    state.pop("lm_head.weight", None)
    torch.save({"config": asdict(model.config), "chars": data.chars, "state_dict": state,
                "corpus": "char_corpus(clean=True)"}, directory / f"microgpt_{size}.pt")
    head = _sweep.header(command, size=size, run=asdict(run), vocab_size=data.vocab_size,
                         parameters=sum(p.numel() for p in model.parameters()))
    final = log["evals"][-1]
    (directory / f"microgpt_{size}.json").write_text(json.dumps(
        {**head, "final_val_loss": final["val_loss"], "train_seconds": log["train_seconds"], "log": log},
        separators=(",", ":")) + "\n")


def load_pretrained(size: str = "target", *, directory: Path | None = None) -> tuple[MicroGPT, CharCorpus]:
    """The shipped ``"target"`` or ``"draft"`` model (fp32, eval mode) and the corpus it reads.

    The corpus is :func:`corpus`; its vocabulary is checked against the one stored with the
    weights, so ids mean the same characters on every Python. ``directory`` reads the files
    from elsewhere than ``attnlab/data/`` (e.g. a ``--out`` folder).
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    if directory is not None:
        saved = torch.load(Path(directory) / f"microgpt_{size}.pt", weights_only=False)
    else:
        with resources.as_file(resources.files("attnlab").joinpath("data", f"microgpt_{size}.pt")) as p:
            saved = torch.load(p, weights_only=False)
    data = corpus()
    if saved["chars"] != data.chars:
        raise RuntimeError(f"microgpt_{size}.pt was trained on a different vocabulary than char_corpus(clean=True)")
    model = MicroGPT(GPTConfig(**saved["config"]))
    state = {k: v.float() if v.is_floating_point() else v for k, v in saved["state_dict"].items()}
    if model.config.tie_weights:
        state["lm_head.weight"] = state["tok_emb.weight"]
    model.load_state_dict(state)
    return model.eval(), data


def load_log(size: str = "target") -> dict:
    """The training log shipped with a model: header, final validation loss, per-step losses, evaluations."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    return _sweep.load_data(f"microgpt_{size}.json")


def training_vocabulary(data: CharCorpus) -> tuple[set[str], set[tuple[str, str]]]:
    """The words of the training text and its adjacent word pairs (a word: a run of ASCII letters)."""
    words = re.findall(r"[A-Za-z]+", data.decode(data.train_ids))
    return set(words), set(zip(words, words[1:]))


def word_shares(texts: list[str], vocabulary: tuple[set[str], set[tuple[str, str]]]) -> dict:
    """How often ``texts`` use the training text's words and adjacent word pairs.

    Each text's first and last words are dropped, since a window of text may start or end inside a
    word (and a sample's first word is its prompt's). Returns the counts and
    ``"real words"`` = (words found in the training text) / words and ``"pairs of the manual"`` =
    (adjacent pairs found adjacent there) / pairs. ``vocabulary`` is :func:`training_vocabulary`.
    """
    known, known_pairs = vocabulary
    words = [re.findall(r"[A-Za-z]+", t)[1:-1] for t in texts]
    flat, pairs = sum(words, []), [p for w in words for p in zip(w, w[1:])]
    if not pairs:
        raise ValueError(f"word_shares: texts hold {len(flat)} words and no word pair; pass longer texts")
    return {"words": len(flat), "real words": sum(w in known for w in flat) / len(flat),
            "word pairs": len(pairs), "pairs of the manual": sum(p in known_pairs for p in pairs) / len(pairs)}


# ---------------------------------------------------------------------------------------------
# The ladder of chapter 4: a counted bigram, then three learned models, 3 rates x 3 seeds each.
# ---------------------------------------------------------------------------------------------

LADDER_MODELS = ("one head", "MicroGPT, 1 layer", "MicroGPT, 2 layers")
LADDER_LRS = (3e-3, 1e-2, 3e-2)
LADDER_SEEDS = (0, 1, 2)
BIGRAM_ALPHAS = (0.01, 0.03, 0.1, 0.3, 1.0)


@dataclass(frozen=True)
class LadderPoint:
    """One training run of the ladder: a model, a peak learning rate, a seed, and the shared recipe."""

    model: str
    lr: float
    seed: int
    steps: int = 400
    warmup: int = 40
    batch: int = 32
    length: int = 32
    d_model: int = 64
    n_heads: int = 4


class OneHead(nn.Module):
    """Step 2 of the ladder: token + position embeddings, one causal attention head, an output layer.

    idx (b, L) -> logits (b, L, V); no feed-forward, no LayerNorm, untied output layer; every
    linear layer has a bias (PyTorch's default initialisation, as the page's class).
    """

    def __init__(self, vocab_size: int, max_len: int, d_model: int):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(vocab_size, d_model), nn.Embedding(max_len, d_model)
        self.attn = MultiHeadAttention(d_model, 1, bias=True)
        self.lm_head = nn.Linear(d_model, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))
        return self.lm_head(self.attn(x, causal=True))


def ladder_model(name: str, vocab_size: int, point: LadderPoint) -> nn.Module:
    """A fresh ladder model by name (one of :data:`LADDER_MODELS`), at the point's width."""
    if name == "one head":
        return OneHead(vocab_size, point.length, point.d_model)
    layers = {"MicroGPT, 1 layer": 1, "MicroGPT, 2 layers": 2}
    if name not in layers:
        raise ValueError(f"name must be one of {LADDER_MODELS}, got {name!r}")
    return MicroGPT(GPTConfig(vocab_size=vocab_size, max_len=point.length, n_layers=layers[name],
                              d_model=point.d_model, n_heads=point.n_heads))


def ladder_splits(data: CharCorpus) -> dict[str, torch.Tensor]:
    """The three texts of the ladder: ``train`` (first 90%), and the validation 10% cut in two
    halves, ``selection`` (picks the learning rate and the bigram's alpha) and ``test`` (reported)."""
    half = len(data.val_ids) // 2
    return {"train": data.train_ids, "selection": data.val_ids[:half], "test": data.val_ids[half:]}


def windows(ids: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every non-overlapping window of ``ids``: inputs and next-character targets, (n, length) each."""
    n = (len(ids) - 1) // length
    if n < 1:
        raise ValueError(f"windows: ids has {len(ids)} elements, fewer than length + 1 = {length + 1}")
    return ids[:n * length].view(n, length), ids[1:n * length + 1].view(n, length)


def count_bigram(ids: torch.Tensor, vocab_size: int, alpha: float) -> torch.Tensor:
    r"""Log-probabilities (V, V) of the counted bigram with add-alpha smoothing, row a = previous char:

    .. math:: \log p(c \mid a) = \log \frac{N(a, c) + \alpha}{\sum_{c'} N(a, c') + V\alpha}
    """
    if alpha <= 0:
        raise ValueError(f"count_bigram: alpha must be positive, got {alpha}")
    counts = torch.zeros(vocab_size, vocab_size, dtype=torch.float64)
    counts.index_put_((ids[:-1], ids[1:]), torch.ones(len(ids) - 1, dtype=torch.float64), accumulate=True)
    counts += alpha
    return (counts / counts.sum(1, keepdim=True)).log()


@torch.no_grad()
def window_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int = 256) -> float:
    """Mean cross-entropy (nats per character) of ``model`` on windows x, y (n, L), in eval mode."""
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(x), chunk):
        logits = model(x[i:i + chunk])
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[i:i + chunk].reshape(-1),
                                 reduction="sum").item()
    model.train(was_training)
    return total / y.numel()


def run_ladder_point(point: LadderPoint) -> dict:
    """Train one ladder model with :func:`attnlab.train.train` and score it on both held-out halves.

    Recipe, the same for every model: AdamW (betas 0.9, 0.95, no weight decay), linear warmup over
    ``warmup`` steps, cosine decay to a tenth of ``lr``, clipping at 1; the seed sets both the
    initial weights and the batches.
    """
    data = corpus()
    splits = ladder_splits(data)
    torch.manual_seed(point.seed)
    model = ladder_model(point.model, data.vocab_size, point)
    gen = torch.Generator().manual_seed(point.seed)
    t0 = time.process_time()
    history = train(model, lambda step: data.batch(point.batch, point.length, generator=gen),
                    steps=point.steps, lr=point.lr, warmup=point.warmup, seed=None, progress=False)
    seconds = time.process_time() - t0
    scores = {name: window_loss(model, *windows(splits[name], point.length)) for name in ("selection", "test")}
    every = 10
    curve = [sum(history.loss[i:i + every]) / every for i in range(0, point.steps, every)]
    return {**asdict(point), "parameters": sum(p.numel() for p in model.parameters()),
            "selection_loss": round(scores["selection"], 4), "test_loss": round(scores["test"], 4),
            "train_curve": [round(v, 4) for v in curve], "curve_every": every,
            "cpu_seconds": round(seconds, 2)}


def bigram_results(data: CharCorpus, length: int = 32) -> dict:
    """The counted bigram: alpha picked on the selection half, cross-entropy on both halves."""
    splits = ladder_splits(data)

    def cross_entropy(logp: torch.Tensor, split: str) -> float:
        return -logp[windows(splits[split], length)].mean().item()

    on_selection = {a: cross_entropy(count_bigram(splits["train"], data.vocab_size, a), "selection")
                    for a in BIGRAM_ALPHAS}
    alpha = min(on_selection, key=on_selection.get)
    logp = count_bigram(splits["train"], data.vocab_size, alpha)
    return {"alpha": alpha, "selection_by_alpha": {str(a): v for a, v in on_selection.items()},
            "selection_loss": on_selection[alpha], "test_loss": cross_entropy(logp, "test")}


def ladder_points() -> list[LadderPoint]:
    """Every run of the ladder: each model x each rate x each seed."""
    return [LadderPoint(m, lr, s) for m in LADDER_MODELS for lr in LADDER_LRS for s in LADDER_SEEDS]


def _ladder_key(p) -> tuple:
    get = (lambda k: p[k]) if isinstance(p, dict) else (lambda k: getattr(p, k))
    return (LADDER_MODELS.index(get("model")), get("lr"), get("seed"))


def run_ladder(out: Path, *, resume: bool = False, points: list[LadderPoint] | None = None,
               progress: bool = True) -> dict:
    """Run (or finish, with ``resume``) the ladder and write it to ``out`` after every point."""
    data = corpus()
    head = _sweep.header("python -m attnlab.experiments.microgpt --ladder",
                         splits={k: len(v) for k, v in ladder_splits(data).items()},
                         bigram=bigram_results(data))
    return _sweep.run_points(points if points is not None else ladder_points(), run_ladder_point,
                             key=_ladder_key, head=head, out=out, resume=resume, progress=progress,
                             desc="ladder")


def ladder_summary(ladder: dict) -> list[dict]:
    """Per model: the rate with the lowest mean selection loss, and at that rate the test loss's
    mean, min and max over seeds (plus every rate's mean selection loss)."""
    rows = []
    for name in LADDER_MODELS:
        pts = [p for p in ladder["points"] if p["model"] == name]
        by_lr = {lr: [p for p in pts if p["lr"] == lr] for lr in sorted({p["lr"] for p in pts})}
        sel = {lr: sum(p["selection_loss"] for p in ps) / len(ps) for lr, ps in by_lr.items()}
        best = min(sel, key=sel.get)
        test = [p["test_loss"] for p in by_lr[best]]
        rows.append({"model": name, "parameters": pts[0]["parameters"], "lr": best, "seeds": len(test),
                     "selection_by_lr": sel, "test_mean": sum(test) / len(test), "test_min": min(test),
                     "test_max": max(test), "points": by_lr[best]})
    return rows


def load_ladder() -> dict:
    """The shipped ladder (``attnlab/data/microgpt_ladder.json``)."""
    return _sweep.load_data("microgpt_ladder.json")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=[*SIZES, "both"], default="both")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoints in --work")
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "attnlab" / "microgpt")
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: attnlab/data/)")
    parser.add_argument("--smoke", action="store_true", help="a few steps, to a temporary folder")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the shipped models: 2)")
    parser.add_argument("--ladder", action="store_true",
                        help="chapter 4's ladder (3 models x 3 rates x 3 seeds) instead of the shipped models")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.ladder:
        out = (args.out or Path(str(resources.files("attnlab").joinpath("data")))) / "microgpt_ladder.json"
        pts = [LadderPoint(**{**asdict(p), "steps": 20, "warmup": 2}) for p in ladder_points()[::9]] \
            if args.smoke else None
        if args.smoke:
            args.work.mkdir(parents=True, exist_ok=True)
        run_ladder(args.work / "ladder_smoke.json" if args.smoke else out, resume=args.resume, points=pts)
        return
    command = ("python -m attnlab.experiments.microgpt" + ("" if args.size == "both" else f" --size {args.size}")
               + ("" if args.threads == 1 else f" --threads {args.threads}"))
    out = args.out or Path(str(resources.files("attnlab").joinpath("data")))
    sizes = list(SIZES) if args.size == "both" else [args.size]
    for size in sizes:
        run = SIZES[size]
        if args.smoke:
            run = RunConfig(**{**asdict(run), "steps": 4, "eval_every": 2, "warmup": 1, "eval_windows": 4})
        model, log = train_size(size, run, work=args.work / ("smoke" if args.smoke else ""),
                                resume=args.resume, checkpoint_every=args.checkpoint_every)
        if not args.smoke:
            save_pretrained(size, model, corpus(), run, log, command, out)
        print(f"{size}: validation loss {log['evals'][-1]['val_loss']:.3f} nats after {run.steps} steps, "
              f"{log['train_seconds']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
