"""Chapter quiz banks: package data ``attnlab/quizzes/NN_name.json``, shown with jupyterquiz.

A bank is a JSON list of questions in jupyterquiz's format:

* multiple choice: ``{"question", "type": "multiple_choice"|"many_choice", "answers":
  [{"answer", "correct", "feedback"}, ...]}``, at least one correct answer, feedback on every option;
* numeric: ``{"question", "type": "numeric", "precision", "answers": [{"type": "value", "value",
  "correct", "feedback"} | {"type": "range", "range": [lo, hi], "correct", "feedback"} |
  {"type": "default", "feedback"}]}``, with a correct value or range and a default feedback.
"""
from __future__ import annotations

import json
from importlib import resources

CHOICE_TYPES = ("multiple_choice", "many_choice")


def bank_names() -> list[str]:
    """Names of the quiz banks shipped with the package, e.g. ``["01_attention_from_scratch"]``."""
    files = resources.files("attnlab") / "quizzes"
    return sorted(f.name[:-5] for f in files.iterdir() if f.name.endswith(".json"))


def load_quiz(name: str) -> list[dict]:
    """Load and validate the bank ``attnlab/quizzes/{name}.json``."""
    path = resources.files("attnlab") / "quizzes" / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"no quiz bank named {name!r}; available: {bank_names()}")
    questions = json.loads(path.read_text(encoding="utf-8"))
    validate_bank(questions, name)
    return questions


def validate_bank(questions: list[dict], name: str = "bank") -> None:
    """Raise ValueError unless every question has a correct answer and feedback on every option."""
    if not isinstance(questions, list) or not questions:
        raise ValueError(f"{name}: a quiz bank is a non-empty JSON list of questions")
    for i, q in enumerate(questions, 1):
        where = f"{name} question {i}"
        if not str(q.get("question", "")).strip():
            raise ValueError(f"{where}: missing 'question' text")
        answers = q.get("answers")
        if not isinstance(answers, list) or not answers:
            raise ValueError(f"{where}: missing 'answers'")
        for j, a in enumerate(answers, 1):
            if not str(a.get("feedback", "")).strip():
                raise ValueError(f"{where}, answer {j}: every option needs 'feedback'")
        kind = q.get("type")
        if kind in CHOICE_TYPES:
            if len(answers) < 2:
                raise ValueError(f"{where}: a choice question needs at least two options")
            if not any(a.get("correct") is True for a in answers):
                raise ValueError(f"{where}: no option is marked correct")
            if any(not str(a.get("answer", "")).strip() for a in answers):
                raise ValueError(f"{where}: every option needs 'answer' text")
        elif kind == "numeric":
            if not any(a.get("correct") is True and a.get("type") in ("value", "range") for a in answers):
                raise ValueError(f"{where}: a numeric question needs a correct 'value' or 'range'")
            if not any(a.get("type") == "default" for a in answers):
                raise ValueError(f"{where}: a numeric question needs a 'default' feedback")
        else:
            raise ValueError(f"{where}: unknown type {kind!r}; use one of {CHOICE_TYPES + ('numeric',)}")


def show_quiz(name: str, **kwargs) -> None:
    """Display a chapter's quiz (works in Jupyter, Colab and the static book)."""
    from jupyterquiz import display_quiz

    display_quiz(load_quiz(name), **{"colors": "fdsp", **kwargs})
