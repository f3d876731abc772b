"""Execute every chapter once, in parallel, and stage the book's sources for Sphinx.

Each notebook runs on a copy in an empty temporary folder (what a Colab reader gets: nothing
may be read by a repository path), in its own kernel, with the thread count taken from the
environment (``make`` sets one thread per kernel and two kernels at a time on two cores).
The executed copies go to ``OUT/notebooks/`` beside copies of ``_config.yml``, ``_toc.yml``
and ``book/``, and the book is then built from ``OUT`` without executing anything again.

The outputs of cells tagged ``nbval-check-output`` are compared with the ones stored in the
repository, after the substitutions in ``tests/nbval_sanitize.cfg`` (nbval's format), the
way ``pytest --nbval-lax`` compares them: text and data outputs, not images or widget views.

usage: execute_notebooks.py [--jobs N] [--out DIR] [--check] [--record] NOTEBOOK...
  --check   exit 1 if a checked output differs from the stored one (``make test``)
  --record  write the fresh checked outputs back into the repository's notebooks (``make record``)
"""
from __future__ import annotations

import argparse
import configparser
import json
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
CHECK = "nbval-check-output"
SKIPPED_MIME = ("image/", "application/vnd.jupyter.widget-view+json")
TIMEOUT_S = 300


def sanitizers(path: Path = ROOT / "tests" / "nbval_sanitize.cfg") -> list[tuple[re.Pattern, str]]:
    parser = configparser.ConfigParser()
    parser.read(path, encoding="utf-8")
    return [(re.compile(parser[s]["regex"]), parser[s]["replace"]) for s in parser.sections()]


def merged(outputs: list[dict]) -> list[dict]:
    """Consecutive stream outputs of one stream joined into one, as nbval does: a print may
    reach the kernel's output in several pieces, how many depends on timing."""
    result = []
    for out in outputs:
        if (out["output_type"] == "stream" and result and result[-1]["output_type"] == "stream"
                and result[-1]["name"] == out["name"]):
            result[-1] = {**result[-1], "text": "".join(result[-1]["text"]) + "".join(out["text"])}
        else:
            result.append(dict(out))
    return result


def comparable(outputs: list[dict], rules) -> list:
    """The parts of a cell's outputs that nbval compares, sanitised."""
    def clean(text: str) -> str:
        for pattern, replacement in rules:
            text = pattern.sub(replacement, text)
        return text

    result = []
    for out in merged(outputs):
        kind = out["output_type"]
        if kind == "stream":
            result.append((kind, out["name"], clean("".join(out["text"]))))
        elif kind in ("execute_result", "display_data"):
            for mime, data in sorted(out.get("data", {}).items()):
                if not mime.startswith(SKIPPED_MIME):
                    text = data if isinstance(data, str) else json.dumps(data, sort_keys=True)
                    result.append((kind, mime, clean("".join(text))))
        elif kind == "error":
            result.append((kind, out["ename"], clean(out["evalue"])))
    return result


def execute(path: str) -> dict:
    """Run one notebook in an empty folder; return it executed, its time and any error."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(path, folder)
        client = NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                resources={"metadata": {"path": folder}})
        try:
            client.execute()
            error = None
        except CellExecutionError as exc:
            error = str(exc)[-3000:]
    return {"path": path, "nb": nb, "seconds": time.perf_counter() - start, "error": error}


def differences(stored: dict, fresh: dict, rules) -> list[str]:
    """Checked cells whose fresh outputs differ from the stored ones."""
    found = []
    for i, (old, new) in enumerate(zip(stored["cells"], fresh["cells"])):
        if old["cell_type"] != "code" or CHECK not in old["metadata"].get("tags", []):
            continue
        want, got = comparable(old.get("outputs", []), rules), comparable(new.get("outputs", []), rules)
        if want != got:
            found.append(f"cell {i}:\n  stored: {want!r:.1500}\n  fresh:  {got!r:.1500}")
    return found


def stage(out: Path) -> None:
    """Copy the book's non-notebook sources into ``out``."""
    if out.exists():
        shutil.rmtree(out)
    (out / "notebooks").mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(ROOT / name, out / name)
    shutil.copytree(ROOT / "book", out / "book")


def record(path: str, fresh: dict) -> None:
    """Store the fresh outputs of the checked cells in the repository's notebook."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    for old, new in zip(nb["cells"], fresh["cells"]):
        if old["cell_type"] == "code" and CHECK in old["metadata"].get("tags", []):
            old["outputs"] = merged(new.get("outputs", []))
            old["execution_count"] = new.get("execution_count")
    Path(path).write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                          encoding="utf-8")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="stage the book's sources here")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args(argv)
    if args.out:
        stage(args.out)
    rules = sanitizers()
    failed, mismatched, rows = [], [], []
    # The slowest chapters first, so that two workers finish at about the same time.
    paths = sorted(args.notebooks, key=lambda p: -Path(p).stat().st_size)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for result in pool.map(execute, paths):
            name = Path(result["path"]).name
            stored = json.loads(Path(result["path"]).read_text(encoding="utf-8"))
            diff = [] if result["error"] else differences(stored, result["nb"], rules)
            rows.append((name, result["seconds"], "error" if result["error"] else
                         f"{len(diff)} checked cells differ" if diff else "ok"))
            print(f"{name:45s} {result['seconds']:6.1f} s  {rows[-1][2]}", flush=True)
            if result["error"]:
                failed.append(f"{name}:\n{result['error']}")
                continue
            if diff:
                mismatched.append(f"{name}: " + "\n".join(diff))
            if args.record:
                record(result["path"], result["nb"])
            if args.out:
                nbformat.write(result["nb"], args.out / "notebooks" / name)
    print(f"{len(rows)} notebooks, {sum(r[1] for r in rows):.0f} s of kernel time, "
          f"slowest {max(r[1] for r in rows):.1f} s")
    for text in failed + mismatched:
        print("\n" + text, file=sys.stderr)
    if failed or (args.check and mismatched):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
