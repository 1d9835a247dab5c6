"""Sweeps across machines: two sweep processes ("machines", each in its own folder) share one study in a
PostgreSQL server; one is killed mid-trial and the other ends the study at the asked count, nothing lost
or run twice. Processes that open a new database at once all get the study; a server that is down,
silent or refuses the login is one sentence, at once.

The server is Debian's PostgreSQL: ``postgres.sh start`` (beside this file) makes a throwaway cluster
on a free port of 127.0.0.1 for this module and ``stop`` ends it; ``make postgres`` installs the server
where missing.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import optuna
import pytest
import sqlalchemy
from lightning.pytorch.callbacks import Callback
from optuna.trial import TrialState
from typing_extensions import override

from src.apps.sweep import open_study
from src.apps.sweep.test_sweep import LR, environment, refusal, space, sweep_command

SCRIPT = Path(__file__).with_name("postgres.sh")
#: the login the script gives its clusters; the workers read the password from PGPASSWORD (libpq's own
#: variable), so that it stays off their command lines
USER, PASSWORD = "sweep", "not-a-secret"


@dataclass
class Server:
    """A running throwaway cluster: its folder and port."""

    folder: Path
    port: int

    def url(self, password: str | None = None, database: str = "sweeps") -> str:
        login = USER if password is None else f"{USER}:{password}"
        return f"postgresql://{login}@127.0.0.1:{self.port}/{database}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    pytest.importorskip("psycopg", reason="the PostgreSQL driver is not installed: make install")
    # straight under /tmp, not pytest's tmp_path: run as root, the script hands the folder to the user
    # postgres, and pytest's folders are closed to other users
    folder = Path(tempfile.mkdtemp(prefix="sweep-postgres-"))
    port = free_port()
    started = subprocess.run(
        [str(SCRIPT), "start", str(folder), str(port)],
        env={**os.environ, "PGPASSWORD": PASSWORD},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if started.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"no PostgreSQL server to test against: {started.stderr.strip()}")
    running = Server(folder, port)
    assert started.stdout.strip() == running.url(PASSWORD)
    try:
        yield running
    finally:
        subprocess.run([str(SCRIPT), "stop", str(folder)], check=True, timeout=120)
        shutil.rmtree(folder)


@pytest.fixture
def engines() -> Iterator[None]:
    """Every SQLAlchemy engine that connects during the test is disposed at its end: the studies made in
    the test keep their connection pools, and psycopg warns of a connection collected while open."""
    made: set[sqlalchemy.engine.Engine] = set()

    def seen(connection: sqlalchemy.engine.Connection) -> None:
        made.add(connection.engine)

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "engine_connect", seen)
    try:
        yield
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "engine_connect", seen)
        for engine in made:
            engine.dispose()


class Stall(Callback):
    """Holds a trial after its first epoch for ``seconds``: a trial long enough to be killed in."""

    def __init__(self, seconds: float = 120.0) -> None:
        self.seconds = seconds

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        time.sleep(self.seconds)


def machine(folder: Path, server: Server, worker: int, *words: str) -> subprocess.Popen[str]:
    """``python -m src.apps.sweep ... --storage postgresql://...`` started in a folder of its own."""
    folder.mkdir()
    command = sweep_command(folder, 4, worker, f"--storage={server.url()}", *words)
    return subprocess.Popen(
        command,
        cwd=folder,
        env={**environment(), "PGPASSWORD": PASSWORD},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def mid_trial(process: subprocess.Popen[str], folder: Path, server: Server) -> optuna.trial.FrozenTrial:
    """The trial ``process`` runs, once it has reported an epoch (at most 120 s)."""
    deadline = time.monotonic() + 120
    # its first trial's log folder: the study's tables exist; reading them sooner would race to make them
    while not (folder / "logs" / "spiral" / "space").exists():
        wait(process, deadline)
    study = optuna.load_study(study_name="space", storage=server.url())
    while True:
        for trial in study.get_trials(states=(TrialState.RUNNING,)):
            if trial.user_attrs.get("process", "").endswith(f":{process.pid}") and trial.intermediate_values:
                return trial
        wait(process, deadline)


def wait(process: subprocess.Popen[str], deadline: float) -> None:
    """A moment's wait, unless ``process`` has ended (its last words fail the test) or time is up."""
    assert process.poll() is None, f"ended before it could be killed: {process.communicate()[1][-2000:]}"
    assert time.monotonic() < deadline, "no trial reported an epoch in time"
    time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.usefixtures("engines")
def test_two_machines_share_a_study_and_a_killed_ones_trial_is_failed_and_run_again(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    # machine 0 starts training only once machine 1 has a trial; machine 1 stalls in its first trial
    with (
        machine(
            tmp_path / "machine0",
            server,
            0,
            "--trainer.callbacks+=src.apps.sweep.test_sweep.AfterTheOtherProcessStarts",
            f"--trainer.callbacks.storage={server.url()}",
        ) as first,
        machine(
            tmp_path / "machine1", server, 1, "--trainer.callbacks+=src.apps.sweep.test_sweep_postgres.Stall"
        ) as second,
    ):
        try:
            killed = mid_trial(second, tmp_path / "machine1", server)
            second.send_signal(signal.SIGKILL)  # without warning
            second.wait()
            out, err = first.communicate(timeout=180)
        finally:
            for process in (first, second):
                if process.poll() is None:
                    process.kill()
    assert first.returncode == 0, err[-2000:]
    assert "Best val/acc" in out

    trials = optuna.load_study(study_name="space", storage=server.url()).trials
    assert len({t.number for t in trials}) == len(trials)
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 4  # the asked count, no more
    # the killed machine's trial is marked failed, and the other machine ran its values again, once
    (interrupted,) = [t for t in trials if t.state == TrialState.FAIL]
    assert interrupted.number == killed.number
    assert interrupted.intermediate_values == killed.intermediate_values  # killed after an epoch
    retried = [t for t in finished if t.system_attrs.get("failed_trial") == interrupted.number]
    assert len(retried) == 1
    assert retried[0].params == interrupted.params
    assert retried[0].user_attrs["process"].endswith(f":{first.pid}")
    assert len({t.params[LR] for t in finished}) == 4  # no values ran twice
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections and never answers, like a server that hangs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["down", "wrong password", "no such database", "silent"])
def test_a_server_that_is_down_or_refuses_the_login_is_one_sentence(
    server: Server, silent_port: int, workdir: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    storage, says = {
        "down": (Server(server.folder, free_port()).url(PASSWORD), "Connection refused"),
        "wrong password": (server.url("wrong"), f'password authentication failed for user "{USER}"'),
        "no such database": (server.url(PASSWORD, database="nope"), 'database "nope" does not exist'),
        "silent": (Server(server.folder, silent_port).url(PASSWORD), "timeout expired"),
    }[case]
    start = time.monotonic()
    err = refusal(capsys, storage)
    # the silent server: libpq's "timeout expired" below is the sweep's connect_timeout; this only bounds
    # a hang (libpq alone waits for ever), generously for a busy machine
    assert time.monotonic() - start < 120
    shown = storage.replace(f":{PASSWORD}@", ":***@").replace(":wrong@", ":***@")
    assert err.startswith(f"error: the study storage {shown!r} cannot be opened (")
    assert err.count("\n") == 1, err
    assert says in err
    assert PASSWORD not in err
    assert "wrong" not in err


def new_database(server: Server, name: str) -> str:
    """The URL of a new, empty database on ``server``."""
    admin = sqlalchemy.create_engine(server.url(PASSWORD, "postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    return server.url(PASSWORD, name)


def opening(name: str, storage: str) -> optuna.Study | BaseException:
    """The study ``open_study`` gives, or what it raised: an exception in a thread would pass unseen."""
    try:
        return open_study(name, storage, space())
    except BaseException as err:
        return err


@pytest.mark.usefixtures("engines")
def test_processes_that_open_a_new_database_at_once_all_get_the_study(server: Server, workdir: Path) -> None:
    """They race to make the tables (a duplicate key in PostgreSQL's catalog): the losers try again."""
    storage = new_database(server, "race")
    ready = threading.Barrier(6)
    opened: list[optuna.Study | BaseException] = []

    def open_it() -> None:
        ready.wait()
        opened.append(opening("race", storage))

    threads = [threading.Thread(target=open_it) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [type(s) for s in opened] == [optuna.Study] * 6, opened
    assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == ["race"]


@pytest.mark.usefixtures("engines")
def test_a_process_that_finds_the_tables_made_while_it_made_them_tries_again(
    server: Server, workdir: Path
) -> None:
    """Two processes open a new database: both find it empty, one makes the tables first, and the other's
    CREATE TYPE then fails ("type studydirection already exists"). Made certain here: the loser is held
    at its CREATE TYPE until the winner has the study."""
    storage = new_database(server, "late")
    at_create, won = threading.Event(), threading.Event()
    failed: list[type[BaseException]] = []

    def hold(connection: object, cursor: object, statement: str, *rest: object) -> None:
        if threading.current_thread().name == "loser" and statement.startswith("CREATE TYPE"):
            at_create.set()
            assert won.wait(60)

    def caught(context: sqlalchemy.engine.ExceptionContext) -> None:
        if threading.current_thread().name == "loser":
            failed.append(type(context.sqlalchemy_exception))

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", hold)
    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "handle_error", caught)
    opened: list[optuna.Study | BaseException] = []
    loser = threading.Thread(target=lambda: opened.append(opening("late", storage)), name="loser")
    try:
        loser.start()
        assert at_create.wait(60)
        winner = open_study("late", storage, space())
        won.set()
        loser.join()
    finally:
        won.set()
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "before_cursor_execute", hold)
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "handle_error", caught)
    assert sqlalchemy.exc.ProgrammingError in failed  # the race happened
    (study,) = opened
    assert isinstance(study, optuna.Study), study
    assert study.study_name == winner.study_name == "late"
