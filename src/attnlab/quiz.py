"""Chapter quiz banks: package data ``attnlab/quizzes/NN_name.json``, shown with jupyterquiz.

A bank is a JSON list of questions in jupyterquiz's format, plus two fields of ours that
jupyterquiz ignores:

* ``"id"``: stable, unique, kebab-case, prefixed with the chapter number and derived from the
  question's content, not its position (``"01-scaling-factor"``), so a reader's answers can be
  remembered by id and questions can be reordered;
* ``"kind"``: ``"concept"`` (understanding), ``"transfer"`` (apply the chapter to a new case:
  compute a size, predict a shape, count, pick the faster form; its answer is computed by the
  library in ``tests/test_quiz_answers.py``) or ``"lecture"`` (what a lecture got wrong).

Question types:

* multiple choice: ``{"question", "type": "multiple_choice"|"many_choice", "answers":
  [{"answer", "correct", "feedback"}, ...]}``, at least one correct answer, feedback on every option;
* numeric: ``{"question", "type": "numeric", "precision"?, "answers": [{"type": "value", "value",
  "correct", "feedback"} | {"type": "range", "range": [lo, hi], "correct", "feedback"} |
  {"type": "default", "feedback"}]}``, with a correct value or range and a default feedback.

How the widget judges a numeric answer (jupyterquiz 2.9.6.4, ``js/numeric.js``), which
:func:`judge_numeric` reproduces and :func:`validate_bank` checks every bank against: with a
``precision`` p, the typed number and each answer's value are rounded to p *significant* digits
(JavaScript's ``toPrecision(p)``, which accepts only 1 ≤ p ≤ 100: ``precision: 0`` throws); then
the answers are tried in order and the first match decides: a value matches when equal after the
rounding, a range ``[lo, hi]`` when lo ≤ x < hi (hi excluded). For an exact integer leave
``precision`` out; for a tolerance use a range.
"""
from __future__ import annotations

import html
import json
import math
import re
from decimal import ROUND_HALF_UP, Decimal, localcontext
from importlib import resources

CHOICE_TYPES = ("multiple_choice", "many_choice")
KINDS = ("concept", "transfer", "lecture")
ID_PATTERN = re.compile(r"^(\d{2})-[a-z0-9]+(?:-[a-z0-9]+)*$")
PRECISION_RANGE = (1, 100)  # what JavaScript's Number.prototype.toPrecision accepts


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


def find_question(question_id: str) -> dict:
    """The question with this ``id`` (e.g. ``"05-llama2-kv-cache-gib"``), from its chapter's bank."""
    match = ID_PATTERN.match(str(question_id))
    if not match:
        raise ValueError(f"question_id must look like 'NN-kebab-case', got {question_id!r}")
    for name in bank_names():
        if name.startswith(match.group(1) + "_"):
            for q in load_quiz(name):
                if q["id"] == question_id:
                    return q
    raise ValueError(f"no question with id {question_id!r}")


def js_to_precision(x: float, precision: int) -> float:
    """``Number(x.toPrecision(precision))`` as JavaScript computes it.

    toPrecision rounds the exact binary value of x to ``precision`` significant digits, ties
    away from zero (ECMA-262: "pick the larger n" on |x|); reading the string back is
    correctly rounded in both languages.
    """
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return x
    with localcontext() as ctx:
        ctx.prec = precision + 30
        exact = Decimal(x)
        quantum = Decimal(1).scaleb(exact.adjusted() - precision + 1)
        return float(exact.quantize(quantum, rounding=ROUND_HALF_UP))


def _answer_matches(answer: dict, submission: float, precision: int | None) -> bool:
    if "value" in answer:
        value = float(answer["value"])
        if precision is not None:
            value = js_to_precision(value, precision)
        return submission == value
    if "range" in answer:
        lo, hi = answer["range"]
        return lo <= submission < hi
    return False


def judge_numeric(question: dict, typed: float) -> dict | None:
    """The answer the jupyterquiz widget picks when a reader types the number ``typed``.

    Returns that answer's dict (its ``"correct"`` says right or wrong), or None when nothing
    matches and the default feedback shows (judged wrong).
    """
    precision = question.get("precision")
    submission = float(typed)
    if precision is not None and precision > 0:
        submission = js_to_precision(submission, precision)
    for answer in question["answers"]:
        if _answer_matches(answer, submission, precision):
            return answer
    return None


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _describe(answer: dict | None, answers: list[dict]) -> str:
    if answer is None:
        return "no answer (the default feedback, judged wrong)"
    j = next(j for j, a in enumerate(answers, 1) if a is answer)
    what = f"value {answer['value']}" if "value" in answer else f"range {answer['range']}"
    return f"answer {j} ({what}, correct={answer.get('correct')})"


def _validate_numeric(q: dict, where: str) -> None:
    answers = q["answers"]
    if "precision" in q:
        p = q["precision"]
        lo, hi = PRECISION_RANGE
        if not (isinstance(p, int) and not isinstance(p, bool) and lo <= p <= hi):
            raise ValueError(
                f"{where}, field 'precision': must be an integer from {lo} to {hi} (significant digits; "
                f"JavaScript's toPrecision throws otherwise), got {p!r}; leave it out for an exact answer")
    for j, a in enumerate(answers, 1):
        at = f"{where}, answer {j}"
        kind = a.get("type")
        if kind not in ("value", "range", "default"):
            raise ValueError(f"{at}, field 'type': must be 'value', 'range' or 'default', got {kind!r}")
        has_value, has_range = "value" in a, "range" in a
        if (kind == "value") != has_value or (kind == "range") != has_range:
            need = "no 'value' and no 'range'" if kind == "default" else f"{kind!r} and not the other of 'value'/'range'"
            raise ValueError(f"{at}, field 'type': a {kind!r} answer takes {need} "
                             f"(the widget goes by the fields present)")
        if kind == "default":
            continue
        if not isinstance(a.get("correct"), bool):
            raise ValueError(f"{at}, field 'correct': must be true or false, got {a.get('correct')!r}")
        if kind == "value" and not _is_number(a["value"]):
            raise ValueError(f"{at}, field 'value': must be a finite number, got {a['value']!r}")
        if kind == "range":
            r = a["range"]
            if not (isinstance(r, list) and len(r) == 2 and all(map(_is_number, r)) and r[0] < r[1]):
                raise ValueError(f"{at}, field 'range': must be [lo, hi] with lo < hi (hi excluded), got {r!r}")
    if not any(a.get("correct") is True and a.get("type") in ("value", "range") for a in answers):
        raise ValueError(f"{where}, field 'answers': a numeric question needs a correct 'value' or 'range'")
    if not any(a.get("type") == "default" for a in answers):
        raise ValueError(f"{where}, field 'answers': a numeric question needs a 'default' feedback")
    # Simulate the widget: the right number typed as the bank states it must be judged right,
    # and no wrong answer's number may be judged right.
    for j, a in enumerate(answers, 1):
        if a.get("type") == "default":
            continue
        if a["type"] == "value":
            typed, label = a["value"], f"its value {a['value']}"
        else:
            lo, hi = a["range"]
            typed, label = (lo + hi) / 2, f"the midpoint {(lo + hi) / 2:g} of its range {a['range']}"
        judged = judge_numeric(q, typed)
        if a["correct"] and not (judged is not None and judged.get("correct") is True):
            p = q.get("precision")
            rounded = "" if p is None else f" (precision {p} rounds it to {js_to_precision(typed, p):g})"
            raise ValueError(
                f"{where}, answer {j}, field '{a['type']}': a reader who types {label}{rounded} is judged by "
                f"{_describe(judged, answers)}, so the right answer shows 'Incorrect'")
        if not a["correct"] and a["type"] == "value" and judged is not None and judged.get("correct") is True:
            raise ValueError(
                f"{where}, answer {j}, field 'value': the wrong value {a['value']} is judged correct by "
                f"{_describe(judged, answers)}")


def validate_bank(questions: list[dict], name: str = "bank") -> None:
    """Raise ValueError unless every question is well formed and answerable in the widget.

    Every question has an ``id`` (kebab-case, prefixed with the bank's chapter number, unique in
    the bank) and a ``kind``; every option has feedback; a choice question has a correct option; a
    numeric question has a valid ``precision`` (or none), and its correct values and ranges are
    judged correct by the widget's own rule (see :func:`judge_numeric`). Messages name the bank,
    the question and the field.
    """
    if not isinstance(questions, list) or not questions:
        raise ValueError(f"{name}: a quiz bank is a non-empty JSON list of questions")
    chapter = name[:2] if re.match(r"^\d{2}(_|$)", name) else None
    seen: dict[str, int] = {}
    for i, q in enumerate(questions, 1):
        if not isinstance(q, dict):
            raise ValueError(f"{name} question {i}: must be a JSON object, got {type(q).__name__}")
        qid = q.get("id")
        where = f"{name} question {i} ({qid})" if isinstance(qid, str) else f"{name} question {i}"
        if not isinstance(qid, str) or not ID_PATTERN.match(qid):
            raise ValueError(f"{where}, field 'id': needs a kebab-case id prefixed with the chapter number, "
                             f"like '01-scaling-factor', got {qid!r}")
        if chapter is not None and not qid.startswith(chapter + "-"):
            raise ValueError(f"{where}, field 'id': must start with the chapter number '{chapter}-'")
        if qid in seen:
            raise ValueError(f"{where}, field 'id': duplicate of question {seen[qid]}'s id")
        seen[qid] = i
        if q.get("kind") not in KINDS:
            raise ValueError(f"{where}, field 'kind': must be one of {KINDS}, got {q.get('kind')!r}")
        if not str(q.get("question", "")).strip():
            raise ValueError(f"{where}, field 'question': missing question text")
        answers = q.get("answers")
        if not isinstance(answers, list) or not answers:
            raise ValueError(f"{where}, field 'answers': missing")
        for j, a in enumerate(answers, 1):
            if not isinstance(a, dict) or not str(a.get("feedback", "")).strip():
                raise ValueError(f"{where}, answer {j}, field 'feedback': every option needs 'feedback'")
        kind = q.get("type")
        if kind in CHOICE_TYPES:
            if len(answers) < 2:
                raise ValueError(f"{where}, field 'answers': a choice question needs at least two options")
            for j, a in enumerate(answers, 1):
                if not isinstance(a.get("correct"), bool):
                    raise ValueError(f"{where}, answer {j}, field 'correct': must be true or false")
                if not str(a.get("answer", "")).strip():
                    raise ValueError(f"{where}, answer {j}, field 'answer': every option needs 'answer' text")
            if not any(a["correct"] for a in answers):
                raise ValueError(f"{where}, field 'correct': no option is marked correct")
        elif kind == "numeric":
            _validate_numeric(q, where)
        else:
            raise ValueError(f"{where}, field 'type': unknown type {kind!r}; use one of {CHOICE_TYPES + ('numeric',)}")


def show_quiz(name: str, **kwargs) -> None:
    """Display a chapter's quiz (works in Jupyter, Colab and the static book).

    In the book, a marker before the quiz names its bank and the questions' stable ids in the
    order they are drawn (never shuffled), so ``book/_static/attnlab-quiz.js`` can keep each
    answer in the reader's browser under its id; elsewhere the marker is an empty div.
    """
    from IPython.display import HTML, display
    from jupyterquiz import display_quiz

    questions = load_quiz(name)
    ids = html.escape(json.dumps([q["id"] for q in questions]), quote=True)
    display(HTML(f'<div class="attnlab-quiz" data-bank="{html.escape(name)}" data-ids="{ids}"></div>'))
    display_quiz(questions, **{"colors": "fdsp", **kwargs, "shuffle_questions": False})
