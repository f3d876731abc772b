"""Repository conventions: one address for the project, notebooks wired into the book."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def repository_url() -> str:
    match = re.search(r"^repository:\s*\n\s+url:\s*(\S+)", (ROOT / "_config.yml").read_text(), re.M)
    assert match, "_config.yml has no repository.url"
    return match.group(1)


def test_readme_uses_the_configured_address():
    assert repository_url() in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_conventions(path):
    nb = json.loads(path.read_text())
    first = nb["cells"][0]
    assert "remove-cell" in first["metadata"].get("tags", [])
    assert "google.colab" in "".join(first["source"])
    assert f"git+{repository_url()}" in "".join(first["source"]), "the Colab cell installs from another address"
    assert path.stem in (ROOT / "_toc.yml").read_text(), f"{path.name} is not in _toc.yml"
    quiz = [c for c in nb["cells"] if "show_quiz(" in "".join(c["source"])]
    assert quiz and "remove-input" in quiz[-1]["metadata"].get("tags", [])
    assert any("nbval-check-output" in c["metadata"].get("tags", []) and c.get("outputs")
               for c in nb["cells"]), "no cell's output is checked by nbval"
    sources = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert not re.search(r"open\(\s*['\"]\.\.?/|\.\./src|\.\./book", sources), "a notebook reads a repository path"


def test_notebooks_are_stripped():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "scripts/strip_outputs.py"), "--check", *map(str, NOTEBOOKS)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


# A checked output must read the same on every machine and thread count. Rounding errors
# (5.3e-15 here, 7.1e-15 there) and float reprs carried to the last bit are what vary, so a
# stored checked output fails on: a number in scientific notation below 1e-6 in magnitude
# (zero included: "0.0e+00" is a rounding error that happened to vanish), or a decimal with
# more than six digits after the point. A bound ("error < 1e-12") is not a result and passes.
# Analytic numbers that are that small are listed here.
ANALYTIC_SMALL_NUMBERS = {
    ("03_transformer_block", "1.75e-07"),  # the Noam schedule's lr(1) = d^-0.5 · 4000^-1.5
}
SCIENTIFIC = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?[eE][-+]?\d+\b")
LONG_DECIMAL = re.compile(r"(?<![\w.])[-+]?\d+\.\d{7,}\b")


def noise_like_numbers(text: str) -> list[str]:
    """Numbers in text that look like rounding noise (see the comment above)."""
    def is_bound(match):
        return re.search(r"(<|<=|≤)\s*$", text[:match.start()]) is not None

    small = [m.group() for m in SCIENTIFIC.finditer(text) if abs(float(m.group())) < 1e-6 and not is_bound(m)]
    return small + [m.group() for m in LONG_DECIMAL.finditer(text)]


def test_the_noise_rule_catches_rounding_errors_and_spares_analytic_numbers():
    assert noise_like_numbers("GLA chunked = recurrent: max error 5.3e-15") == ["5.3e-15"]
    assert noise_like_numbers("recurrent  elu  7e-16  True") == ["7e-16"]
    assert noise_like_numbers("moved by 0.0e+00") == ["0.0e+00"]
    assert noise_like_numbers("share 0.30000001192092896") == ["0.30000001192092896"]
    assert noise_like_numbers("4.19e+06 bytes, 1.80e+16 FLOPs, ratio 0.650, max error < 1e-12: True") == []


def checked_outputs(nb: dict):
    for i, cell in enumerate(nb["cells"]):
        if "nbval-check-output" not in cell["metadata"].get("tags", []):
            continue
        for out in cell.get("outputs", []):
            yield i, "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_checked_outputs_hold_no_rounding_noise(path):
    nb = json.loads(path.read_text())
    found = [(i, s) for i, text in checked_outputs(nb) for s in noise_like_numbers(text)
             if (path.stem, s) not in ANALYTIC_SMALL_NUMBERS]
    assert not found, f"checked cells print rounding noise (cell, number): {found}"


def test_the_book_build_detects_a_changed_checked_output(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("execute_notebooks", ROOT / "scripts/execute_notebooks.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    rules = runner.sanitizers()

    def notebook(text: str, tags=("nbval-check-output",)) -> dict:
        out = {"output_type": "stream", "name": "stdout", "text": [text]}
        return {"cells": [{"cell_type": "code", "metadata": {"tags": list(tags)}, "outputs": [out]}]}

    assert runner.differences(notebook("8192 queries\n"), notebook("8192 queries\n"), rules) == []
    assert runner.differences(notebook("8192 queries\n"), notebook("8191 queries\n"), rules)
    assert runner.differences(notebook("a\n", ()), notebook("b\n", ()), rules) == []  # not a checked cell
    # a print that arrived in two pieces is the same output
    split = notebook("8192 ")
    split["cells"][0]["outputs"].append({"output_type": "stream", "name": "stdout", "text": ["queries\n"]})
    assert runner.differences(notebook("8192 queries\n"), split, rules) == []
    # the sanitiser's substitutions apply, as in nbval: random quiz ids and addresses
    assert runner.differences(notebook('id="abcdefghijkl"'), notebook('id="zyxwvutsrqpo"'), rules) == []


# Which PyTorch release first has each feature the code uses (from the release notes). The
# declared floor in pyproject.toml and the README's table must be the newest of those used.
TORCH_FEATURES = {
    "FlopCounterMode": (2, 1),
    "sdpa_kernel": (2, 3),
    "RMSNorm": (2, 4),
    "rms_norm": (2, 4),
    "enable_gqa": (2, 5),
}
# Not visible as a name: SDPA returns zeros (not NaN) for a fully masked query from 2.5 on
# (pytorch/pytorch#133882, `_safe_softmax`); chapter 01 and tests/test_attention.py rely on it.
TORCH_BEHAVIOURS = {"SDPA's zero output for a fully masked query": (2, 5)}


def test_the_declared_torch_floor_is_the_newest_feature_used():
    code = "\n".join(p.read_text() for folder in ("src", "notebooks", "tests", "benchmarks")
                     for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".ipynb")
                     and p.name != "test_repository.py")
    used = {name: v for name, v in TORCH_FEATURES.items() if re.search(rf"\b{name}\b", code)}
    assert used, "no versioned feature found: the scan is broken"
    floor = max([*used.values(), *TORCH_BEHAVIOURS.values()])
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = re.search(r'"torch>=(\d+)\.(\d+)"', pyproject)
    assert declared and tuple(map(int, declared.groups())) == floor, (declared, floor)
    readme = (ROOT / "README.md").read_text()
    assert f"torch>={floor[0]}.{floor[1]}" in readme
    for name in used:
        assert name in readme, f"the README's version table does not list {name}"


def test_the_declared_python_floor_matches_the_pins():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.11"' in pyproject
    for page in ("README.md", "book/how_to_use.md"):
        text = (ROOT / page).read_text()
        assert "3.11" in text and "3.10" not in text, page


# The teaching pattern (design.md, "The teaching pattern"), enforced for the chapters that
# have been converted to it; the issues for the later parts extend this list.
PATTERN_CHAPTERS = [
    "01_attention_from_scratch",
    "02_positional_encodings",
    "03_transformer_block",
    "04_micro_gpt",
    "05_kv_cache",
    "06_icl_grokking_diff_attention",
    "07_flash_attention",
    "09_linear_attention",
    "08_sparse_attention",
    "10_state_space_models",
    "11_mamba",
    "12_hybrid_architectures",
    "13_recall_lab",
    "14_frontiers",
]
CODE_COLUMN = 88  # characters that fit the book's code column at a 1280-px window
BOOK_URL = re.search(r"^\s+baseurl:\s*(\S+)", (ROOT / "_config.yml").read_text(), re.M).group(1)
CALLOUT = re.compile(r'<details class="lecture-note">\s*<summary>In the lecture: .+?</summary>(.*?)</details>', re.S)
LECTURE_VOICE = re.compile(r"\bPart [AB]\b|\b(?:lecture|source|notes?)(?:'s)? (?:writes|says|claims|states|gets)\b", re.I)


def words(markdown: str) -> int:
    """Alphabetic words outside math and HTML tags: how the design counts prose."""
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]*\$|<[^>]+>|\([^)\s]*\)", " ", markdown, flags=re.S)
    return len(re.findall(r"[A-Za-z]+", text))


def pattern_notebook(stem: str) -> dict:
    return json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())


def source(cell) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("stem", PATTERN_CHAPTERS)
def test_pattern_code_fits_the_book_column(stem):
    too_long = [(i, line) for i, c in enumerate(pattern_notebook(stem)["cells"]) if c["cell_type"] == "code"
                for line in source(c).splitlines() if len(line) > CODE_COLUMN]
    assert not too_long, f"{len(too_long)} code lines over {CODE_COLUMN} characters, e.g. {too_long[:3]}"


@pytest.mark.parametrize("stem", PATTERN_CHAPTERS)
def test_pattern_lecture_corrections_live_in_callouts(stem):
    cells = [source(c) for c in pattern_notebook(stem)["cells"] if c["cell_type"] == "markdown"]
    for text in cells:
        for body in CALLOUT.findall(text):
            assert f"{BOOK_URL}book/errata.html#" in body, f"a callout without its errata link: {body[:120]!r}"
        lesson = CALLOUT.sub("", text)
        assert "<details class=\"lecture-note\">" not in lesson, "a callout not in the one consistent form"
        voice = LECTURE_VOICE.search(lesson)
        assert not voice, f"lecture-correction voice in the lesson: {lesson[max(voice.start() - 60, 0):voice.end() + 60]!r}"
        assert not re.search(r"\]\((?:\.\.?/)", lesson), "relative links break in Colab: use the book's address"


@pytest.mark.parametrize("stem", PATTERN_CHAPTERS)
def test_pattern_builds_draws_shows_and_exercises(stem):
    cells = pattern_notebook(stem)["cells"]
    code = "\n".join(source(c) for c in cells if c["cell_type"] == "code")
    prose = "\n".join(source(c) for c in cells if c["cell_type"] == "markdown")
    assert words(prose) >= 2500, f"{words(prose)} words of prose"
    assert len(re.findall(r"\bdiagrams\.\w+\(", code)) >= 2, "fewer than two concept diagrams"
    assert "show_source(" in code, "the library's version is never shown"
    exercises = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                 and re.match(r"#+ Exercise \d", source(c).lstrip())]
    assert 3 <= len(exercises) <= 5, f"{len(exercises)} exercises"
    for i in exercises:
        solution = cells[i + 1]
        tags = solution["metadata"].get("tags", [])
        # hide-cell: the book folds the code *and* its output (the answer) behind one toggle
        assert solution["cell_type"] == "code" and "hide-cell" in tags, f"exercise at cell {i}: no hidden solution"
        jupyter = solution["metadata"].get("jupyter", {})
        assert jupyter.get("source_hidden") is True and jupyter.get("outputs_hidden") is True, \
            f"exercise at cell {i}: hide the solution and its output in JupyterLab too"
        assert "assert " in source(solution), f"exercise at cell {i}: the solution checks nothing"
