"""Build one chapter as a small book and photograph it, to look at it while writing it.

    .venv/bin/python scripts/preview.py notebooks/02_positional_encodings.ipynb [--no-execute]
        [--width 1280 --width 390] [--mode light --mode dark] [--find TEXT]

Executes the chapter (as `make book` does), builds a book holding only it, and saves
screenshots of the page, one viewport-high tile at a time, as
/tmp/preview/<chapter>/<mode>-<width>-NN.png; with --find, only the tile(s) around each
element whose text contains TEXT. Needs Debian's chromium (never `playwright install`).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def build(notebook: Path, out: Path, execute: bool) -> Path:
    src = out / "source"
    if out.exists():
        shutil.rmtree(out)
    (src / "notebooks").mkdir(parents=True)
    for name in ("_config.yml",):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "book", src / "book")
    (src / "_toc.yml").write_text(f"format: jb-book\nroot: book/intro\nchapters:\n"
                                  f"  - file: notebooks/{notebook.stem}\n  - file: book/errata\n"
                                  f"  - file: book/progress\n")
    if execute:
        subprocess.run([sys.executable, str(ROOT / "scripts/execute_notebooks.py"), "--jobs", "1",
                        "--out", str(out / "executed"), str(notebook)], check=True,
                       env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **__import__("os").environ})
        shutil.copy(out / "executed" / "notebooks" / notebook.name, src / "notebooks" / notebook.name)
    else:
        shutil.copy(notebook, src / "notebooks" / notebook.name)
    subprocess.run([str(BIN / "jupyter-book"), "build", str(src), "--path-output", str(out), "-q"],
                   check=True, stdout=subprocess.DEVNULL)
    return out / "_build" / "html" / "notebooks" / f"{notebook.stem}.html"


def photograph(page_path: Path, shots: Path, widths, modes, find) -> list[Path]:
    from playwright.sync_api import sync_playwright

    saved = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--headless", "--no-sandbox", "--disable-gpu"])
        for mode in modes:
            for width in widths:
                height = 1600 if width > 600 else 900
                page = browser.new_page(viewport={"width": width, "height": height})
                page.add_init_script(f"localStorage.setItem('mode', '{mode}');"
                                     f"localStorage.setItem('theme', '{mode}');")
                page.goto(page_path.as_uri(), wait_until="load")
                page.wait_for_timeout(2500)
                total = page.evaluate("document.documentElement.scrollHeight")
                if find:
                    tops = page.evaluate("t => [...document.querySelectorAll('article *')]"
                                         ".filter(e => [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.includes(t)))"
                                         ".map(e => e.getBoundingClientRect().top + window.scrollY)", find)
                    starts = sorted({max(int(t) - 100, 0) for t in tops})
                else:
                    starts = range(0, total, height)
                for i, y in enumerate(starts):
                    page.evaluate(f"window.scrollTo(0, {y})")
                    page.wait_for_timeout(300)
                    path = shots / f"{mode}-{width}-{i:02d}.png"
                    page.screenshot(path=str(path))
                    saved.append(path)
                page.close()
        browser.close()
    return saved


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--no-execute", action="store_true", help="use the notebook as it is")
    parser.add_argument("--width", type=int, action="append")
    parser.add_argument("--mode", choices=("light", "dark"), action="append")
    parser.add_argument("--find", help="photograph only around elements containing this text")
    args = parser.parse_args(argv)
    out = Path("/tmp/preview") / args.notebook.stem
    page = build(args.notebook.resolve(), out / "book", not args.no_execute)
    shots = out / "shots"
    shots.mkdir(parents=True, exist_ok=True)
    for old in shots.glob("*.png"):
        old.unlink()
    for path in photograph(page, shots, args.width or [1280], args.mode or ["light"], args.find):
        print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
