"""The worker processes: answers in order, the function's own error, a killed worker's pending calls
refused as a broken executor and a new worker for the next one, and nothing left running after shutdown."""

import os
import signal
import time
from concurrent.futures import BrokenExecutor

import psutil  # type: ignore[import-untyped]  # no py.typed; in requirements.lock
import pytest

from src.extras import workers


def test_a_worker_answers_in_order_survives_being_killed_and_leaves_nothing_running() -> None:
    here = psutil.Process()
    before = {child.pid for child in here.children(recursive=True)}
    [first, second] = [workers.submit("test", os.getpid) for _ in range(2)]
    worker = first.result(timeout=60)
    assert worker == second.result(timeout=60) != os.getpid()  # one worker, in a process of its own
    with pytest.raises(ValueError, match="invalid literal"):  # the function's own error, as raised there
        workers.submit("test", int, "x").result(timeout=60)
    sleeping = workers.submit("test", time.sleep, 60)
    queued = workers.submit("test", os.getpid)
    os.kill(worker, signal.SIGKILL)
    for pending in (sleeping, queued):
        with pytest.raises(BrokenExecutor, match="exit status -9"):
            pending.result(timeout=60)
    replacement = workers.submit("test", os.getpid).result(timeout=60)
    assert replacement not in (worker, os.getpid())
    assert workers.running("test")
    workers.shutdown("test")
    assert not workers.running("test")
    assert {child.pid for child in here.children(recursive=True)} == before
    assert not psutil.pid_exists(replacement) or psutil.Process(replacement).status() == psutil.STATUS_ZOMBIE


def test_a_call_cancelled_before_it_is_sent_never_runs(tmp_path) -> None:
    busy = workers.submit("test", time.sleep, 1)
    dropped = workers.submit("test", (tmp_path / "ran").write_text, "yes")
    cancelled = dropped.cancel()  # still queued behind the sleep, or already sent
    busy.result(timeout=60)
    workers.shutdown("test")
    assert (tmp_path / "ran").exists() is not cancelled


def test_a_worker_runs_at_the_trainings_priority_and_is_gone_once_shut_down() -> None:
    """Not below it: on a machine busy with other work a lower priority starves the worker, and the fit's
    end waits on it. Shutdown returns once the worker exited."""
    assert workers.submit("priority", os.nice, 0).result(timeout=60) == os.nice(0)
    pid = workers.submit("priority", os.getpid).result(timeout=60)
    workers.shutdown("priority")
    assert not psutil.pid_exists(pid)  # exited and reaped


def test_purposes_share_one_worker_which_ends_with_the_last_of_them() -> None:
    here = psutil.Process()
    before = {child.pid for child in here.children(recursive=True)}
    drawing, fitting = workers.submit("drawing", os.getpid), workers.submit("fitting", os.getpid)
    assert drawing.result(timeout=60) == fitting.result(timeout=60) != os.getpid()
    workers.shutdown("fitting")  # the other still uses it
    assert workers.running("drawing")
    assert not workers.running("fitting")
    assert workers.submit("drawing", os.getpid).result(timeout=60) == drawing.result()
    workers.shutdown("drawing")
    assert {child.pid for child in here.children(recursive=True)} == before


def test_a_purpose_may_end_without_waiting_for_its_calls() -> None:
    """A run that failed does not wait for its background work: the worker ends now, its calls fail."""
    pid = workers.submit("abandoned", os.getpid).result(timeout=60)
    sleeping = workers.submit("abandoned", time.sleep, 60)
    while not sleeping.running():  # sent: under way in the worker
        time.sleep(0.01)
    started = time.monotonic()
    workers.shutdown("abandoned", wait=False)
    assert time.monotonic() - started < 30
    with pytest.raises(BrokenExecutor):
        sleeping.result(timeout=60)
    assert not psutil.pid_exists(pid)
