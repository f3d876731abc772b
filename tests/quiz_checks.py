"""Shared checks for the quiz-answer tests (tests/test_quiz_answers*.py)."""
from torch.utils.flop_counter import FlopCounterMode

from attnlab.quiz import find_question, judge_numeric

GiB, MiB = 2**30, 2**20


def accepts(qid: str, computed: float) -> None:
    """The widget marks the computed answer right (and the question is a transfer question)."""
    q = find_question(qid)
    assert q["kind"] == "transfer" and q["type"] == "numeric", qid
    judged = judge_numeric(q, computed)
    assert judged is not None and judged["correct"] is True, (qid, computed, judged)


def correct_option(qid: str) -> str:
    q = find_question(qid)
    assert q["kind"] == "transfer" and q["type"] != "numeric", qid
    (text,) = [a["answer"] for a in q["answers"] if a["correct"]]
    return text


def flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()
