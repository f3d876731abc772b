"""Every quiz bank validates: a correct answer per question, feedback on every option."""
import copy

import pytest

from attnlab.quiz import bank_names, load_quiz, validate_bank

BANKS = bank_names()


def test_there_are_banks():
    assert "01_attention_from_scratch" in BANKS


@pytest.mark.parametrize("name", BANKS)
def test_bank_is_valid_and_large_enough(name):
    questions = load_quiz(name)
    assert len(questions) >= 8
    for q in questions:
        if q["type"] == "multiple_choice":
            assert sum(a["correct"] for a in q["answers"]) == 1, q["question"]


def test_validator_rejects_missing_feedback_and_missing_correct():
    good = load_quiz("01_attention_from_scratch")
    bad = copy.deepcopy(good)
    bad[0]["answers"][1]["feedback"] = ""
    with pytest.raises(ValueError, match="question 1, answer 2: every option needs 'feedback'"):
        validate_bank(bad)
    bad = copy.deepcopy(good)
    for a in bad[0]["answers"]:
        a["correct"] = False
    with pytest.raises(ValueError, match="no option is marked correct"):
        validate_bank(bad)
    with pytest.raises(ValueError, match="no quiz bank named"):
        load_quiz("99_nothing")
