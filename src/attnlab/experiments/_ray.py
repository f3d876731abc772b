"""Run a sweep's points as Ray tasks: on a local Ray (loopback only) or on an existing cluster.

Ray is optional (``pip install "attnlab[sweep]"``); nothing here imports it until a session
starts. :func:`ray_executor` gives :func:`attnlab.experiments._sweep.run_points` an
``executor``: each point becomes one task (one CPU, one torch thread, never retried), and a
``ray.wait`` loop hands back the finished points one by one, so the sweep's progress bar and its
resumable result file work as with the local backend. A point computes the same numbers as
in the local loop (fixed seeds, one thread), bit for bit.

What a local session does, each step for a reason met on this machine:

- sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before ``import ray`` (otherwise Ray listens on
  every interface; with it every listener binds 127.0.0.1), and ``RAY_USAGE_STATS_ENABLED=0``
  (no usage report: the run must not reach the network);
- passes a random ``RAY_AUTH_TOKEN`` (one per process) unless one is set (Ray 2.60 turns token
  authentication on and would otherwise write ``~/.ray/auth_token``);
- starts Ray with ``address="local"`` (a ``RAY_ADDRESS`` in the environment would make it
  try to join a cluster) in a short temporary folder (Unix socket paths hold at most 107
  bytes), and removes that folder after ``ray.shutdown()``; it never runs ``ray stop``,
  which ends every Ray process on the machine by name.

With ``address`` (a running cluster, e.g. ``ray://head:10001`` or ``head:6379``), the tasks
need the package on the workers: the ``attnlab`` folder is shipped with
``runtime_env={"py_modules": [...]}``; torch and tqdm must be installed there. The
environment's ``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN`` are left as the user set them.
"""
from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

INSTALL_HINT = 'pip install "attnlab[sweep]" (Ray)'
REQUIRE_FLAG = "ATTNLAB_REQUIRE_RAY"
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}
# One token for every local session of this process: Ray keeps the first token it reads, so a
# second session with a new one fails to authenticate to its own GCS.
_LOCAL_TOKEN = secrets.token_hex(16)
_imported_here = False           # whether ray was first imported by a session of this module


def have_ray() -> bool:
    """Whether Ray is installed (found without importing it, so the environment can still be set first)."""
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def _set_env(values: dict) -> dict:
    """Set ``values`` in os.environ and return the RAY_* variables as they were (Ray itself sets
    some, such as RAY_AUTH_MODE, while it runs)."""
    before = {k: v for k, v in os.environ.items() if k.startswith("RAY_")}
    os.environ.update(values)
    return before


def _restore_env(before: dict) -> None:
    for key in [k for k in os.environ if k.startswith("RAY_")]:
        if key not in before:
            del os.environ[key]
    os.environ.update(before)


def package_dir() -> str:
    """The folder of the installed ``attnlab`` package (what ``py_modules`` ships to cluster workers)."""
    import attnlab

    return str(Path(attnlab.__file__).resolve().parent)


@contextmanager
def ray_session(address: str | None = None, workers: int = 2) -> Iterator[object]:
    """Start Ray (``address`` None: a local Ray of ``workers`` CPUs on loopback; else connect to
    that cluster), yield the ``ray`` module, and shut it down and clean up afterwards."""
    if not have_ray():
        raise ImportError(f"--backend ray needs Ray: {INSTALL_HINT}")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    local = address is None
    env = dict(QUIET_ENV)
    if local:
        env.update(LOOPBACK_ENV)
        if not os.environ.get("RAY_AUTH_TOKEN"):
            env["RAY_AUTH_TOKEN"] = _LOCAL_TOKEN
    before = _set_env(env)
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp") if local else None
    try:
        global _imported_here
        if local and "ray" in sys.modules and not _imported_here:
            print("note: ray was imported before the loopback setting; check its listeners", file=sys.stderr)
        _imported_here = _imported_here or "ray" not in sys.modules
        import ray

        if local:
            ray.init(address="local", num_cpus=workers, include_dashboard=False, _temp_dir=temp_dir,
                     log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=address, runtime_env={"py_modules": [package_dir()]}, log_to_driver=False,
                     configure_logging=False)
        try:
            yield ray
        finally:
            ray.shutdown()
    finally:
        _restore_env(before)
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def _one_point(run_point: Callable, point) -> dict:
    """The task body: one torch thread (results depend on the thread count), then the point."""
    import torch

    torch.set_num_threads(1)
    return run_point(point)


def ray_executor(run_point: Callable, *, address: str | None = None, workers: int = 2) -> Callable:
    """An ``executor`` for :func:`attnlab.experiments._sweep.run_points`: ``todo -> iterator`` of
    results, each point a Ray task (num_cpus=1, max_retries=0), yielded as they finish."""

    def execute(todo: Sequence) -> Iterator[dict]:
        if not todo:
            return
        with ray_session(address, workers) as ray:
            task = ray.remote(num_cpus=1, max_retries=0)(_one_point)
            pending = [task.remote(run_point, p) for p in todo]
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                yield ray.get(done[0])

    return execute
