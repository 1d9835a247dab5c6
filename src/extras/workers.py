"""A worker process for work beside the training that runs Python of its own (fitting the baselines,
drawing figures): one, shared by every purpose in the order of their calls, started on first use and ended
once every purpose that used it said its work is done (:func:`shutdown`), so that the command leaves no
process behind. One, not one per purpose: on a machine of two cores the training takes one, and two
workers starting beside it (each importing its libraries) would take turns with the training on the other.

A thread of the training's process would hold its interpreter's lock while it runs Python, and the
training would wait for it; a process does not. It runs at the training's own priority: a lower one
would leave the training the second core on an idle machine, but on one busy with other work it starves
the worker, and the fit's end waits on it (at the lowest, for minutes). A worker is a fresh interpreter
(``python -c``) that imports only what the submitted function's module imports, never the main module (a
CLI's ``python -m src.cli`` would import Lightning), so it starts in the time its own imports take. Calls
and answers go through its stdin and stdout as pickles, in order; there is no pool, queue or semaphore,
so no resource tracker outlives the command either.
"""

import contextlib
import pickle
import queue
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

T = TypeVar("T")
#: the worker's start: the parent's import path first, then the loop of :func:`serve`
START = (
    "import pickle, sys; sys.path[:] = pickle.load(sys.stdin.buffer); "
    "import src.extras.workers; src.extras.workers.serve()"
)


class Worker:
    """One worker process: calls written by a thread of their own (a large one never blocks the caller
    while the worker is busy), answers read by another, each answer settling the oldest call sent. A call
    cancelled before it is sent is never sent."""

    def __init__(self) -> None:
        command = [sys.executable, "-c", START]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.sent: deque[Future[Any]] = deque()
        self.submitted: list[Future[Any]] = []
        self.calls: queue.Queue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.Queue()
        )
        self.writer = threading.Thread(target=self._write, daemon=True, name="worker-calls")
        self.reader = threading.Thread(target=self._read, daemon=True, name="worker-answers")
        self.writer.start()
        self.reader.start()

    def submit(self, function: Callable[..., T], *args: Any) -> "Future[T]":
        future: Future[T] = Future()
        self.submitted.append(future)
        self.calls.put((future, function, args))
        return future

    def _write(self) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        try:
            pickle.dump(list(sys.path), stdin)  # the first message: the import path
            while (call := self.calls.get()) is not None:
                future, function, args = call
                if future.set_running_or_notify_cancel():
                    self.sent.append(future)
                    pickle.dump((function, args), stdin)
                    stdin.flush()
        except OSError:  # the worker died: the reader settles what was sent, the rest is settled here
            while (call := self.calls.get()) is not None:
                if call[0].set_running_or_notify_cancel():
                    call[0].set_exception(BrokenProcessPool("the worker process ended before it was asked"))
        finally:
            with contextlib.suppress(OSError):
                stdin.close()  # the worker's loop ends on EOF

    def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        while True:
            try:
                ok, value = pickle.load(stdout)
            except Exception:  # EOF: the worker ended, of its own accord or killed
                break
            future = self.sent.popleft()
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)
        stdout.close()
        code = self.process.wait()
        while self.sent:
            self.sent.popleft().set_exception(
                BrokenProcessPool(f"the worker process ended (exit status {code}) before it answered")
            )

    def shutdown(self, wait: bool = True) -> None:
        """Wait for the answers to the calls submitted (``wait``), then end the worker: it holds nothing
        more, and the teardown of the modules its work imported is time its user would wait for. Without
        ``wait`` the calls not yet answered fail as the worker's end."""
        self.calls.put(None)
        if wait:
            self.writer.join()  # every call sent (or dropped, cancelled), and its stdin closed
            futures.wait(self.submitted)  # answered, or failed with the worker
        if self.process.poll() is None:
            self.process.kill()
        self.writer.join()
        self.reader.join()  # and reaped


#: the worker, once started and until every purpose that used it shut down
_worker: Worker | None = None
#: the calls of each purpose using the worker, by purpose
_calls: dict[str, list[Future[Any]]] = {}


def submit(purpose: str, function: Callable[..., T], *args: Any) -> "Future[T]":
    """``function(*args)`` on the worker process, for ``purpose`` (calls run in submission order, whatever
    their purpose). ``function`` must be importable by name from a module that imports little (no
    Lightning, no torch where it can be helped), and ``args`` picklable. A worker that ended (killed, say)
    is replaced."""
    global _worker
    if _worker is None or _worker.process.poll() is not None:
        if _worker is not None:  # ended (killed, say): its threads let go, a new one started
            _worker.calls.put(None)
        _worker = Worker()
    future = _worker.submit(function, *args)
    _calls.setdefault(purpose, []).append(future)
    return future


def running(purpose: str) -> bool:
    """Whether ``purpose`` used the worker and did not shut down yet."""
    return purpose in _calls


def shutdown(purpose: str, wait: bool = True) -> None:
    """Wait for the calls of ``purpose`` (``wait``; else those not begun are dropped), then end the worker
    if no other purpose uses it: what a user of :func:`submit` calls when it has no more, so that the
    command leaves no process behind."""
    global _worker
    calls = _calls.pop(purpose, [])
    if wait:
        futures.wait(calls)
    else:
        for call in calls:
            call.cancel()
    if not _calls and _worker is not None:
        worker, _worker = _worker, None
        worker.shutdown(wait)


def serve() -> None:
    """The worker's loop: each call read from stdin run, its answer (``(True, value)`` or ``(False,
    exception)``) written to stdout, until stdin ends."""
    # a terminal's Ctrl-C reaches every process of the command, and the training's own decides how the run
    # ends (its end shuts the workers down); a worker would only print its traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    calls, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # what the work prints goes to stderr, never among the answers
    while True:
        try:
            function, args = pickle.load(calls)
        except EOFError:
            return
        try:
            answer: tuple[bool, Any] = (True, function(*args))
        except Exception as err:
            answer = (False, err)
        try:
            data = pickle.dumps(answer)
        except Exception as err:  # an answer or error that does not pickle: its text
            data = pickle.dumps((False, RuntimeError(f"{type(err).__name__}: {err}")))
        answers.write(data)
        answers.flush()
