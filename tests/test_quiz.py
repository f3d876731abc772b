"""Every quiz bank validates: ids and kinds, a correct answer per question, feedback on every option,
and numeric answers that jupyterquiz's widget actually accepts (its rule simulated in attnlab.quiz,
and checked against the widget's own JavaScript when node is installed)."""
import copy
import json
import shutil
import subprocess
from pathlib import Path

import pytest

import jupyterquiz
from attnlab.quiz import KINDS, bank_names, find_question, js_to_precision, judge_numeric, load_quiz, validate_bank

BANKS = bank_names()
NAME = "01_attention_from_scratch"


def _question(bank, qid):
    return next(q for q in bank if q["id"] == qid)


def test_there_are_banks():
    assert NAME in BANKS


@pytest.mark.parametrize("name", BANKS)
def test_bank_is_valid_and_large_enough(name):
    questions = load_quiz(name)
    assert len(questions) >= 8
    for q in questions:
        if q["type"] == "multiple_choice":
            assert sum(a["correct"] for a in q["answers"]) == 1, q["question"]
        assert q["kind"] in KINDS


def test_ids_are_unique_across_banks_and_prefixed_with_the_chapter():
    ids = [(name, q["id"]) for name in BANKS for q in load_quiz(name)]
    assert len({qid for _, qid in ids}) == len(ids)
    assert all(qid.startswith(name[:2] + "-") for name, qid in ids)
    assert find_question("01-weights-per-head-n4096")["type"] == "numeric"
    with pytest.raises(ValueError, match="no question with id"):
        find_question("01-no-such-question")


def test_validator_rejects_missing_feedback_and_missing_correct():
    good = load_quiz(NAME)
    bad = copy.deepcopy(good)
    bad[0]["answers"][1]["feedback"] = ""
    with pytest.raises(ValueError, match=r"question 1 \(01-scaling-factor\), answer 2, field 'feedback'"):
        validate_bank(bad)
    bad = copy.deepcopy(good)
    for a in bad[0]["answers"]:
        a["correct"] = False
    with pytest.raises(ValueError, match="no option is marked correct"):
        validate_bank(bad)
    with pytest.raises(ValueError, match="no quiz bank named"):
        load_quiz("99_nothing")


@pytest.mark.parametrize("precision", [0, -1, 101, 2.5, "3", True, None])
def test_validator_rejects_a_precision_toprecision_cannot_take(precision):
    bad = copy.deepcopy(load_quiz(NAME))
    bad[3]["precision"] = precision
    with pytest.raises(ValueError, match=rf"^{NAME} question 4 \(01-weights-per-head-n4096\), field 'precision'"):
        validate_bank(bad, NAME)


def test_validator_rejects_duplicate_missing_and_unprefixed_ids():
    good = load_quiz(NAME)
    bad = copy.deepcopy(good)
    bad[5]["id"] = bad[1]["id"]
    with pytest.raises(ValueError,
                       match=rf"{NAME} question 6 \(01-why-several-heads\), field 'id': duplicate of question 2"):
        validate_bank(bad, NAME)
    bad = copy.deepcopy(good)
    del bad[2]["id"]
    with pytest.raises(ValueError, match=rf"{NAME} question 3, field 'id'"):
        validate_bank(bad, NAME)
    bad = copy.deepcopy(good)
    bad[2]["id"] = "02-cross-attention-sources"
    with pytest.raises(ValueError, match="must start with the chapter number '01-'"):
        validate_bank(bad, NAME)
    bad[2]["id"] = "01_Cross attention"
    with pytest.raises(ValueError, match="kebab-case"):
        validate_bank(bad, NAME)


def test_validator_rejects_a_missing_or_unknown_kind():
    bad = copy.deepcopy(load_quiz(NAME))
    del bad[6]["kind"]
    with pytest.raises(ValueError, match=rf"{NAME} question 7 \(01-permutation-equivariance\), field 'kind'"):
        validate_bank(bad, NAME)
    bad[6]["kind"] = "trivia"
    with pytest.raises(ValueError, match="field 'kind': must be one of"):
        validate_bank(bad, NAME)


def test_validator_rejects_a_correct_value_shadowed_by_an_earlier_wrong_answer():
    bad = copy.deepcopy(load_quiz(NAME))
    q = bad[3]                                            # n² = 16777216, wrong answers 4096 and 8192
    q["answers"].insert(0, {"type": "range", "range": [1e7, 1e8], "correct": False, "feedback": "Too big."})
    with pytest.raises(ValueError, match=r"question 4 \(01-weights-per-head-n4096\), answer 2, field 'value': "
                                         r"a reader who types its value 16777216 is judged by answer 1"):
        validate_bank(bad, NAME)
    # the same shadowing through rounding: at 1 significant digit 16777216 and a wrong 20000000 coincide
    bad = copy.deepcopy(load_quiz(NAME))
    bad[3]["precision"] = 1
    bad[3]["answers"].insert(0, {"type": "value", "value": 20000000, "correct": False, "feedback": "Rounded."})
    with pytest.raises(ValueError, match="judged by answer 1 .value 20000000, correct=False."):
        validate_bank(bad, NAME)


def test_validator_rejects_a_range_whose_midpoint_the_rounding_pushes_out():
    """The bug chapter 04 had: precision 2 means 2 significant digits, so 4.17 became 4.2."""
    bad = copy.deepcopy(load_quiz("04_micro_gpt"))
    q = _question(bad, "04-initial-loss-65-chars")
    q["precision"] = 2
    with pytest.raises(ValueError, match=r"field 'range': a reader who types the midpoint 4.17 .* rounds it to 4.2"):
        validate_bank(bad, "04_micro_gpt")


def test_validator_rejects_a_wrong_value_judged_correct_and_malformed_answers():
    bad = copy.deepcopy(load_quiz(NAME))
    bad[3]["answers"].append({"type": "value", "value": 16777216, "correct": False, "feedback": "Hm."})
    with pytest.raises(ValueError, match="the wrong value 16777216 is judged correct by answer 1"):
        validate_bank(bad, NAME)
    for answer, field in [({"type": "value", "value": "16", "correct": True}, "value"),
                          ({"type": "range", "range": [5, 1], "correct": True}, "range"),
                          ({"type": "value", "range": [1, 5], "correct": True}, "type"),
                          ({"type": "value", "value": 3, "correct": "yes"}, "correct")]:
        bad = copy.deepcopy(load_quiz(NAME))
        bad[3]["answers"].insert(0, {**answer, "feedback": "x"})
        with pytest.raises(ValueError, match=rf"question 4 \(01-weights-per-head-n4096\), answer 1, field '{field}'"):
            validate_bank(bad, NAME)


def test_js_to_precision_rounds_like_javascript():
    # values printed by node: Number(x.toPrecision(p)); ties go away from zero on the exact binary value
    cases = [(0.125, 2, 0.13), (-0.125, 2, -0.13), (1.005, 3, 1.0), (2.5, 1, 3), (16777216, 1, 2e7),
             (16777216, 8, 16777216), (4.174387269895637, 2, 4.2), (88.72283935546875, 1, 90),
             (0.0006987712429686843, 3, 0.000699), (3.3616, 3, 3.36), (0, 5, 0)]
    for x, p, expected in cases:
        assert js_to_precision(x, p) == expected, (x, p)


def test_the_issue_example_is_now_accepted():
    q = find_question("01-weights-per-head-n4096")
    assert "precision" not in q
    assert judge_numeric(q, 16777216)["correct"] is True
    assert judge_numeric(q, 4096)["correct"] is False
    assert judge_numeric(q, 12345) is None


def _numeric_cases():
    """(bank, id, precision, answers, typed string, expected correctness) for every value and range midpoint."""
    cases = []
    for name in BANKS:
        for q in load_quiz(name):
            if q["type"] != "numeric":
                continue
            for a in q["answers"]:
                if a["type"] == "value":
                    typed = json.dumps(a["value"])
                elif a["type"] == "range":
                    typed = repr((a["range"][0] + a["range"][1]) / 2)
                else:
                    continue
                cases.append({"bank": name, "id": q["id"], "precision": q.get("precision"),
                              "answers": q["answers"], "typed": typed, "correct": a["correct"]})
    return cases


_NODE_DRIVER = r"""
const fs = require('fs');
const [jsPath, casesPath] = process.argv.slice(2);
globalThis.Question = class { static register() {} };
globalThis.jaxify = s => s;
const fb = {style: {}, innerHTML: '', className: '', classList: {add() {}}, parentElement: {parentElement: {id: 'w'}}};
globalThis.document = {getElementById: id => id.startsWith('fb') ? fb : null};
const log = console.log; console.log = () => {};
eval(fs.readFileSync(jsPath, 'utf8') + '\nglobalThis.check_numeric = check_numeric;');
const results = JSON.parse(fs.readFileSync(casesPath, 'utf8')).map(c => {
  const classes = [];
  const dataset = {answers: JSON.stringify(c.answers)};
  if (c.precision !== null) dataset.precision = String(c.precision);
  const input = {value: c.typed, id: 'q1-0', dataset, className: '', blur() {}, closest() { return null; },
                 classList: {add(x) { classes.push(x); }}};
  try { check_numeric(input, {keyCode: 13}); } catch (e) { return 'error: ' + e.message; }
  return classes.includes('correctButton');
});
log(JSON.stringify(results));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_widgets_own_javascript_agrees(tmp_path):
    """Run jupyterquiz's check_numeric in node on every stated value and range midpoint of every bank:
    the right ones are marked right, the wrong ones wrong, and nothing throws (precision 0 did)."""
    js = Path(jupyterquiz.__file__).parent / "js" / "numeric.js"
    cases = _numeric_cases()
    assert len(cases) > 100
    (tmp_path / "cases.json").write_text(json.dumps(cases), encoding="utf-8")
    (tmp_path / "driver.js").write_text(_NODE_DRIVER, encoding="utf-8")
    run = subprocess.run(["node", str(tmp_path / "driver.js"), str(js), str(tmp_path / "cases.json")],
                         capture_output=True, text=True, timeout=60, check=True)
    results = json.loads(run.stdout)
    wrong = [(c["bank"], c["id"], c["typed"], r) for c, r in zip(cases, results) if r is not c["correct"]]
    assert not wrong, wrong
    # and the Python simulation gives the same verdicts
    for c in cases:
        judged = judge_numeric({"precision": c["precision"], "answers": c["answers"]}, float(c["typed"]))
        assert (judged is not None and judged["correct"]) is c["correct"], c


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_javascript_rejects_precision_zero(tmp_path):
    """The original bug, reproduced: precision 0 makes toPrecision throw, so the right answer cannot be given."""
    js = Path(jupyterquiz.__file__).parent / "js" / "numeric.js"
    q = find_question("01-weights-per-head-n4096")
    cases = [{"precision": 0, "answers": q["answers"], "typed": "16777216"}]
    (tmp_path / "cases.json").write_text(json.dumps(cases), encoding="utf-8")
    (tmp_path / "driver.js").write_text(_NODE_DRIVER, encoding="utf-8")
    run = subprocess.run(["node", str(tmp_path / "driver.js"), str(js), str(tmp_path / "cases.json")],
                         capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(run.stdout)[0].startswith("error: toPrecision")
