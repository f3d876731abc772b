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
