"""Check, from a built wheel's file list, that it carries the package data a Colab reader needs.

Reading the list (not installing the wheel) avoids pulling a multi-GB torch build.
usage: check_wheel.py WHEEL
"""
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(wheel: str) -> int:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"attnlab/{p.relative_to(REPO / 'src/attnlab').as_posix()}"
                for p in (REPO / "src/attnlab").rglob("*")
                if p.is_file() and "__pycache__" not in p.parts
                and (p.suffix == ".py" or p.parent.name in ("quizzes", "data"))}
    missing = sorted(expected - names)
    quizzes = sorted(n for n in names if n.startswith("attnlab/quizzes/") and n.endswith(".json"))
    if missing or not quizzes:
        print(f"{Path(wheel).name} lacks:", *(missing or ["any quiz bank"]), sep="\n  ")
        return 1
    print(f"{Path(wheel).name}: {len(expected)} package files present, quiz banks: {', '.join(quizzes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
