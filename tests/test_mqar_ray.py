"""The recall grid's Ray backend: the same points on a local Ray give the same bits as the local
loop, Ray listens on loopback only, and it leaves no process and no temporary folder behind.

Skipped when Ray is missing, unless ATTNLAB_REQUIRE_RAY=1 (make test sets it and installs Ray
from requirements-test.txt): then a missing Ray fails.
"""
import os
from pathlib import Path

import pytest

from attnlab.experiments import _ray
from attnlab.experiments import mqar as lab

REQUIRED = os.environ.get(_ray.REQUIRE_FLAG) == "1"
HAVE = _ray.have_ray()                   # found without importing: the loopback setting must come first
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
# Two points of about a second each at one thread.
TINY = dict(seq_len=32, n_pairs=4, steps=30, eval_every=10, val_size=64, test_size=128, batch=16, warmup=3)


def test_ray_is_installed_where_required():
    if REQUIRED:
        assert HAVE, f"{_ray.REQUIRE_FLAG}=1 but Ray is not installed; {_ray.INSTALL_HINT}"
    elif not HAVE:
        pytest.skip(f"Ray is not installed ({_ray.INSTALL_HINT})")


def _listeners(processes) -> set:
    import psutil

    found = set()
    for p in processes:
        try:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    found.add((p.pid, c.laddr.ip, c.laddr.port))
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.mark.skipif(not HAVE and not REQUIRED, reason=f"Ray is not installed ({_ray.INSTALL_HINT})")
def test_ray_backend_matches_the_local_loop_on_loopback_and_cleans_up(tmp_path, monkeypatch):
    import psutil

    me = psutil.Process()
    children_before = {p.pid for p in me.children(recursive=True)}
    own_listeners_before = _listeners([me])
    temp_before = {p.name for p in Path("/tmp").glob("ray*")}
    token_file = Path.home() / ".ray" / "auth_token"
    token_before = token_file.exists()
    env_before = {k: v for k, v in os.environ.items() if k.startswith("RAY_")}
    seen = {}

    real_executor = _ray.ray_executor

    def watched_executor(run_point, **kwargs):
        execute = real_executor(run_point, **kwargs)

        def run(todo):
            for i, result in enumerate(execute(todo)):
                if i == 0:                                   # Ray is up: look at its processes
                    ray_processes = [p for p in me.children(recursive=True) if p.pid not in children_before]
                    seen["processes"] = len(ray_processes)
                    seen["listeners"] = _listeners(ray_processes) | (_listeners([me]) - own_listeners_before)
                yield result

        return run

    monkeypatch.setattr(_ray, "ray_executor", watched_executor)
    scan = [lab.GridPoint("hybrid", 16, lr=3e-3, **TINY), lab.GridPoint("linear_attention", 16, lr=1e-2, **TINY)]
    local = lab.run_grid(scan, tmp_path / "local.json", stages=("scan",), progress=False)
    on_ray = lab.run_grid(scan, tmp_path / "ray.json", stages=("scan",), backend="ray", workers=2, progress=False)

    fields = ("architecture", "val_accuracy", "test_accuracy", "param_hash", "pairs_back", "curve", "steps_run")
    assert [{k: r[k] for k in fields} for r in local["points"]] == [{k: r[k] for k in fields} for r in on_ray["points"]]
    assert len({r["param_hash"] for r in local["points"]}) == 2
    assert seen["processes"] >= 3 and seen["listeners"], seen                  # gcs, raylet, workers were up
    assert {ip for _, ip, _ in seen["listeners"]} <= LOOPBACK, seen["listeners"]

    import time

    deadline = time.monotonic() + 15
    while {p.pid for p in me.children(recursive=True)} - children_before and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p.name() for p in me.children(recursive=True) if p.pid not in children_before]
    assert not left, f"Ray left processes behind: {left}"
    assert {p.name for p in Path("/tmp").glob("ray*")} <= temp_before | {"ray"}   # its short temp folder is gone
    assert token_file.exists() == token_before                                    # no ~/.ray/auth_token written
    assert {k: v for k, v in os.environ.items() if k.startswith("RAY_")} == env_before      # restored
