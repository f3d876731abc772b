"""Strip notebook outputs, keeping those of cells tagged ``nbval-check-output``.

nbval compares only cells with a stored output, so those few deterministic cells are
committed with their output and execution count; every other cell is committed bare.

usage: strip_outputs.py [--check] NOTEBOOK...
  --check  change nothing; exit 1 and list the notebooks that are not stripped
"""
import json
import sys

KEEP = "nbval-check-output"


def stripped(nb: dict) -> dict:
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        if KEEP not in cell.get("metadata", {}).get("tags", []):
            cell["outputs"], cell["execution_count"] = [], None
        cell["metadata"].pop("execution", None)
    nb.get("metadata", {}).pop("widgets", None)
    return nb


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    dirty = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = json.dumps(stripped(json.loads(text)), indent=1, ensure_ascii=False) + "\n"
        if new != text:
            dirty.append(path)
            if not check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    if check and dirty:
        print("not stripped (run `make strip`):", *dirty, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
