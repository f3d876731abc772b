"""The loop every sweep shares: resume skips what is done, two workers give the same file."""
import json

from attnlab.experiments import _sweep


def square(point: int) -> dict:
    return {"x": point, "y": point * point}


def key(r) -> int:
    return r["x"] if isinstance(r, dict) else r


def test_resume_runs_only_the_missing_points(tmp_path):
    out = tmp_path / "sweep.json"
    _sweep.run_points([3, 1], square, key=key, head=_sweep.header("first"), out=out, progress=False)
    ran = []

    def spy(point):
        ran.append(point)
        return square(point)

    result = _sweep.run_points([1, 2, 3], spy, key=key, head=_sweep.header("second"), out=out,
                               resume=True, progress=False)
    assert ran == [2]
    assert [r["x"] for r in json.loads(out.read_text())["points"]] == [1, 2, 3]
    assert result["command"] == "second" and len(result["points"]) == 3


def test_two_workers_write_the_same_points_as_one(tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    head = _sweep.header("c", seeds=[0])
    _sweep.run_points(range(5), square, key=key, head=head, out=one, progress=False)
    _sweep.run_points(range(5), square, key=key, head=head, out=two, jobs=2, order=lambda p: -p,
                      progress=False)
    assert json.loads(one.read_text()) == json.loads(two.read_text())
