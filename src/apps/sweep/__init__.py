"""Hyperparameter sweeps with Optuna: each trial an ordinary run of the CLI, the study in a database.

    python -m src.apps.sweep --space src/apps/sweep/digits.yaml --trials 20 --config configs/digits.yaml
    make sweep CONFIG=configs/digits.yaml SPACE=src/apps/sweep/digits.yaml TRIALS=20

The space file names dotted config keys and their ranges, the metric and its direction, the sampler and
the pruner (``src/apps/sweep/digits.yaml`` shows every key). Each trial runs
``python -m src.cli fit <your words> --<key>=<value> ...`` in this process and logs to
``logs/<experiment>/<study>/trial<N>``, so TensorBoard's HParams tab shows every trial's values and
metrics. Optuna's pruner stops a trial whose validation metric falls behind after any epoch (or, with
``cv: K`` in the space file, after any fold).

The study lives in ``logs/sweeps/<study>.db`` (SQLite), or in any database ``--storage`` names: for
sweeps across machines, a PostgreSQL server (``--storage postgresql://user:password@host/database``). A
process counts the study's finished trials (complete or pruned) and runs trials until there are
``--trials``: run the same command again after a crash and it goes on; a trial whose process died is
marked failed once it has missed three heartbeats, and run again with the same values.
Several processes on one study share the work; give each its own ``--worker`` number, which enters the
sampler's seed so that they do not propose the same values (so do the trials the study already holds,
for a resumed sweep). At the end the best value and parameters are printed and
``logs/sweeps/<study>-best.yaml`` holds the best trial's whole config, ready to run.
"""

import argparse
import io
import json
import logging
import os
import socket
import sqlite3
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import lightning as L
import numpy as np
import optuna
import sqlalchemy
import yaml
from lightning.pytorch.callbacks import Callback
from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState
from typing_extensions import override

from src.apps.cv import cross_validate, mean_std
from src.cli import CLI, main
from src.errors import UserInputError
from src.files import check_output, written
from src.settings import config_files

SWEEPS = Path("logs") / "sweeps"
#: what a study needs to reach its trial count: finished trials, and those that are being run
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
UNDER_WAY = (*FINISHED, TrialState.RUNNING)
#: seconds to wait for another process's lock on a SQLite study, or for a database server to answer,
#: while opening it (once open, a process waits far longer: parallel workers take turns to write)
OPEN_WAIT = 5
#: the driver's argument that bounds that wait, by database (a server's driver waits for ever by default)
WAIT_ARGUMENT = {"sqlite": "timeout", "postgresql": "connect_timeout", "mysql": "connect_timeout"}


@dataclass
class Space:
    """A search space file, as read.

    Attributes:
        params: Dotted config key → ``{type: float|int, low, high, log?, step?}`` or
            ``{type: categorical, choices: [...]}``; a choice may be a list (the MLP's
            ``model.init_args.net.init_args.hidden_sizes``).
        metric: The validation metric the sweep optimizes and the pruner watches.
        direction: ``maximize`` or ``minimize``.
        sampler: ``{type: <a class of optuna.samplers>, <its arguments>...}``.
        pruner: ``{type: <a class of optuna.pruners>, <its arguments>...}``.
        cv: Folds per trial; the objective is then the mean over the folds. ``None``: one run per trial.
        heartbeat: Seconds between a running trial's signs of life in the storage.
    """

    params: dict[str, dict[str, Any]]
    metric: str = "val/loss"
    direction: Literal["maximize", "minimize"] = "minimize"
    sampler: dict[str, Any] = field(default_factory=lambda: {"type": "TPESampler"})
    pruner: dict[str, Any] = field(default_factory=lambda: {"type": "MedianPruner"})
    cv: int | None = None
    heartbeat: int = 10

    @classmethod
    def read(cls, path: str | Path) -> "Space":
        try:
            raw = yaml.safe_load(Path(path).read_text())
            space = cls(**raw)
        except (OSError, yaml.YAMLError, TypeError) as err:
            raise UserInputError(f"search space {str(path)!r} cannot be read: {err}") from err
        if space.direction not in ("maximize", "minimize"):
            raise UserInputError(f"search space {str(path)!r}: direction must be maximize or minimize.")
        for key, spec in space.params.items():
            if not isinstance(spec, dict) or spec.get("type") not in ("float", "int", "categorical"):
                raise UserInputError(
                    f"search space {str(path)!r}: {key} needs type float, int or categorical, got {spec!r}."
                )
        return space


@runtime_checkable
class ShowsHParams(Protocol):
    """A callback that writes further hyperparameters into TensorBoard's HParams table (the dashboard's)."""

    hparams: dict[str, Any]


def suggest(trial: optuna.Trial, key: str, spec: dict[str, Any]) -> Any:
    """The trial's value for one config key, drawn by Optuna from ``spec``."""
    options = {k: v for k, v in spec.items() if k != "type"}
    if spec["type"] == "float":  # float(): YAML 1.1 reads 1e-4 (no dot) as a string
        low, high = float(options.pop("low")), float(options.pop("high"))
        return trial.suggest_float(key, low, high, **options)
    if spec["type"] == "int":
        return trial.suggest_int(key, int(options.pop("low")), int(options.pop("high")), **options)
    choices = spec["choices"]
    stored = [_stored(c) for c in choices]
    return choices[stored.index(trial.suggest_categorical(key, stored))]


def _stored(choice: Any) -> Any:
    """A categorical choice as Optuna stores it: None, bool, int, float or str; a list as its JSON text."""
    return choice if choice is None or isinstance(choice, bool | int | float | str) else json.dumps(choice)


def decode(space: Space, params: dict[str, Any]) -> dict[str, Any]:
    """A trial's stored parameters as config values (a list choice back from its JSON text)."""
    decoded = {}
    for key, value in params.items():
        spec = space.params[key]
        if spec["type"] == "categorical":
            value = spec["choices"][[_stored(c) for c in spec["choices"]].index(value)]
        decoded[key] = value
    return decoded


def param_words(params: dict[str, Any]) -> list[str]:
    """``--key=value`` words that set the parameters, as a user would type them."""
    return [f"--{key}={_text(value)}" for key, value in params.items()]


def searched(params: dict[str, Any]) -> dict[str, bool | int | float | str]:
    """A trial's values as HParams columns: ``model.optimizer.lr`` for
    ``model.init_args.optimizer.init_args.lr``, lists as text."""
    return {
        key.replace(".init_args", ""): value if isinstance(value, bool | int | float | str) else str(value)
        for key, value in params.items()
    }


def _text(value: Any) -> str:
    """A value as typed on the command line: a string as it is (jsonargparse would keep JSON's quotes),
    anything else as JSON, which YAML reads back."""
    return value if isinstance(value, str) else json.dumps(value)


class OptunaPruning(Callback):
    """Reports the monitored metric to an Optuna trial after each validation epoch; stops a trial the
    pruner gives up on by raising :class:`optuna.TrialPruned`.

    ``optuna_integration.PyTorchLightningPruningCallback`` does the same for ``pytorch_lightning``;
    this one is for the ``lightning`` package this project uses.
    """

    def __init__(self, trial: optuna.Trial, monitor: str) -> None:
        self.trial = trial
        self.monitor = monitor

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            raise UserInputError(
                f"the sweep's metric {self.monitor!r} is not logged; the run logs "
                f"{sorted(trainer.callback_metrics)}."
            )
        epoch = trainer.current_epoch
        self.trial.report(float(value), step=epoch)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"{self.monitor}={float(value):.4g} after epoch {epoch}")


class TrialStopped(RuntimeError):
    """A trial's run stopped on bad input (a bad key or value, bad data): the sweep stops with its one
    sentence, printed once (``said``: the run printed it already).

    Args:
        sentence: What stopped the trial.
        said: Whether the run has printed the sentence itself.
    """

    def __init__(self, sentence: str, said: bool = False) -> None:
        super().__init__(sentence)
        self.said = said


class QuietOwnFailures(logging.Filter):
    """Drops Optuna's report of a trial that ended with one of the sweep's own exceptions (a trial stopped
    on bad input, said in one sentence; a trial the study no longer needed): its warning, whose
    traceback runs the whole chain from the CLI up, and the line after it on the value."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped: int | None = None  # the trial whose report was just dropped

    @override
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        message = record.getMessage()
        if isinstance(error, TrialStopped | Surplus):
            self.dropped = int(message.split()[1]) if message.startswith("Trial ") else None
            return False
        after, self.dropped = self.dropped, None
        return not (after is not None and message.startswith(f"Trial {after} failed with value "))


@contextmanager
def quiet_own_failures() -> Iterator[None]:
    """:class:`QuietOwnFailures` on Optuna's log handlers, for the time of the block."""
    handlers = logging.getLogger("optuna").handlers
    quiet = QuietOwnFailures()
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)


class Surplus(Exception):
    """A trial asked for after other processes had already taken the study's last trials."""


class Objective:
    """Runs one trial: the user's words plus the trial's values, through the CLI."""

    def __init__(self, words: Sequence[str], space: Space, trials: int, group: str) -> None:
        self.words, self.space, self.trials, self.group = list(words), space, trials, group

    def __call__(self, trial: optuna.Trial) -> float:
        # trial numbers are handed out in order by the storage: the first `trials` of those finished or
        # under way are the study's; a later one lost a race with another process and does not run
        ahead = trial.study.get_trials(deepcopy=False, states=UNDER_WAY)
        if sum(t.number < trial.number for t in ahead) >= self.trials:
            raise Surplus(f"the study already has its {self.trials} trials")
        params = {key: suggest(trial, key, spec) for key, spec in self.space.params.items()}
        words = [*self.words, *param_words(params)]
        version = f"{self.group}/trial{trial.number:03d}"
        trial.set_user_attr("command", " ".join(["python -m src.cli fit", *words]))
        trial.set_user_attr("process", f"{socket.gethostname()}:{os.getpid()}")
        which = f"trial {trial.number} ({' '.join(param_words(params))})"
        try:
            if self.space.cv is not None:
                return self._cross_validate(trial, words, version)
            run = _built([*words, f"--trainer.logger.init_args.version={version}"], which)
            run.trainer.callbacks.append(OptunaPruning(trial, self.space.metric))  # type: ignore[attr-defined]
            for callback in run.trainer.callbacks:  # type: ignore[attr-defined]
                if isinstance(callback, ShowsHParams):  # the HParams table leads with the searched values
                    callback.hparams.update(searched(params))
            trial.set_user_attr("log_dir", run.trainer.log_dir)
            run.trainer.fit(run.model, datamodule=run.datamodule)
            value = run.trainer.callback_metrics.get(self.space.metric)
            if value is None:
                raise UserInputError(f"the sweep's metric {self.space.metric!r} is not logged by the run.")
        except UserInputError as err:  # bad data or a refusal met while training
            raise TrialStopped(f"{which} stopped: {err}") from err
        except SystemExit as err:  # a fold's run (cv) has printed its one-sentence error
            raise TrialStopped(f"{which} stopped with exit status {err.code}", said=True) from err
        return float(value)

    def _cross_validate(self, trial: optuna.Trial, words: list[str], version: str) -> float:
        assert self.space.cv is not None
        values: list[float] = []

        def after_fold(fold: int, metrics: dict[str, float]) -> None:
            if self.space.metric not in metrics:
                raise UserInputError(f"the sweep's metric {self.space.metric!r} is not logged by the run.")
            values.append(metrics[self.space.metric])
            # the running mean after each fold: the pruner compares trials fold by fold
            trial.report(mean_std(values)[0], step=fold)
            if trial.should_prune():
                raise optuna.TrialPruned(
                    f"mean {self.space.metric}={mean_std(values)[0]:.4g} after fold {fold}"
                )

        cross_validate(words, self.space.cv, group=version, after_fold=after_fold)
        return mean_std(values)[0]


def _built(words: list[str], which: str) -> CLI:
    """The trial's run, built by the CLI as ``fit`` would build it; a refusal of its words or data stops
    the trial with the CLI's sentence (held back from stderr, to be said once, by the sweep)."""
    said = io.StringIO()
    try:
        with redirect_stderr(said):
            return main(words, run=False)
    except SystemExit as err:
        errors = [line for line in said.getvalue().splitlines() if line.startswith("error: ")]
        sentence = errors[0].removeprefix("error: ") if errors else f"exit status {err.code}"
        raise TrialStopped(f"{which} stopped: {sentence}") from err
    finally:
        # whatever else was printed while building (warnings), as it came
        lines = said.getvalue().splitlines(keepends=True)
        sys.stderr.writelines(line for line in lines if not line.startswith("error: "))


def open_study(name: str, storage: str | None, space: Space, worker: int = 0) -> optuna.Study:
    """The study ``name`` in ``storage`` (``logs/sweeps/<name>.db`` when left out), created if new."""
    if storage is None:
        SWEEPS.mkdir(parents=True, exist_ok=True)
        storage = f"sqlite:///{SWEEPS / name}.db"
    url = _check_storage(storage)
    # SQLite serializes writers; a process waits for the lock instead of failing after 5 s
    engine_kwargs = {"connect_args": {"timeout": 120}} if url.get_backend_name() == "sqlite" else {}
    for attempt in range(1, 6):
        try:
            with warnings.catch_warnings():
                # the heartbeat that tells a dead trial from a running one is marked experimental by Optuna
                warnings.simplefilter("ignore", ExperimentalWarning)
                rdb = optuna.storages.RDBStorage(
                    storage,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=space.heartbeat,
                    grace_period=3 * space.heartbeat,
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                        max_retry=2
                    ),
                )
            break
        except (
            sqlalchemy.exc.OperationalError,
            sqlalchemy.exc.IntegrityError,
            sqlalchemy.exc.ProgrammingError,
        ) as err:
            # processes that start on a new database at once race to create its tables and stamp its
            # schema version (SQLite: "table studies already exists"; PostgreSQL: "type studydirection
            # already exists", a duplicate key in its catalog); the loser finds them made when it tries again
            if attempt == 5:
                raise UserInputError(_storage_problem(url, err)) from err
            time.sleep(attempt)
        except RuntimeError as err:  # Optuna's schema check: a study file of another Optuna version
            shown = url.render_as_string(hide_password=True)
            raise UserInputError(
                f"the study storage {shown!r} cannot be used: {str(err).replace('$STORAGE_URL', shown)}"
            ) from err
    study = optuna.create_study(
        study_name=name,
        storage=rdb,
        direction=space.direction,
        pruner=_build(optuna.pruners, space.pruner),
        load_if_exists=True,
    )
    # a seeded sampler in a second process, or in the same command run again after a crash, would
    # propose the values it proposed before: its seed is drawn from (seed, worker, trials already held)
    study.sampler = _build(optuna.samplers, space.sampler, (worker, len(study.get_trials(deepcopy=False))))
    return study


def _check_storage(storage: str) -> sqlalchemy.engine.URL:
    """The parsed URL of ``storage``, once it has been opened, its tables read and (SQLite) a write tried
    and rolled back: a wrong URL, a missing driver, a file that is not a database, one that cannot be
    written or one that another process holds locked, a server that is down, silent or refuses the login
    is refused here in one sentence, without the long lock waits and retries that opening the study
    allows itself."""
    try:
        url = sqlalchemy.engine.make_url(storage)
        sqlite = url.get_backend_name() == "sqlite"
        wait = WAIT_ARGUMENT.get(url.get_backend_name())
        engine = sqlalchemy.create_engine(url, connect_args={wait: OPEN_WAIT} if wait else {})
    except sqlalchemy.exc.ArgumentError as err:  # unparsable, or a database SQLAlchemy does not know
        raise UserInputError(
            f"--storage {storage!r} is not a database URL SQLAlchemy can use ({err}); "
            "for a SQLite file write sqlite:///path/to/study.db."
        ) from err
    except ImportError as err:
        raise UserInputError(
            f"the study storage {url.render_as_string(hide_password=True)!r} needs the database driver "
            f"{err.name or str(err)!r}, which is not installed; install it, or use a SQLite file: "
            "sqlite:///path/to/study.db."
        ) from err
    try:
        with engine.connect() as connection:
            sqlalchemy.inspect(connection).get_table_names()  # reads the schema: not a database, damaged
            if sqlite:  # a read-only file or folder, a lock held by another process
                connection.exec_driver_sql("BEGIN IMMEDIATE")
                connection.exec_driver_sql("CREATE TABLE sweep_write_check (x)")
                connection.rollback()
    except sqlalchemy.exc.DBAPIError as err:
        raise UserInputError(_storage_problem(url, err)) from err
    finally:
        engine.dispose()
    return url


def _storage_problem(url: sqlalchemy.engine.URL, err: sqlalchemy.exc.DBAPIError) -> str:
    """One sentence on why the study storage ``url`` cannot be opened, and what to do."""
    code = getattr(err.orig, "sqlite_errorcode", None)
    if code is None:  # a database server: its driver's words (libpq's run over lines), on one line
        shown = url.render_as_string(hide_password=True)
        words = "; ".join(" ".join(line.split()) for line in str(err.orig).splitlines() if line.strip())
        return (
            f"the study storage {shown!r} cannot be opened ({words}); check that the server runs and "
            "answers at that host and port, and the user, password and database the URL names."
        )
    file = Path(url.database or ":memory:")
    code &= 0xFF  # the primary result code: SQLITE_READONLY_DIRECTORY is a SQLITE_READONLY
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return (
            f"the study database {file} is locked by another process (waited {OPEN_WAIT} s); let that "
            "process finish or end its open transaction, then run the sweep again."
        )
    if code == sqlite3.SQLITE_NOTADB:
        return (
            f"{file} is not a SQLite database; name a new file for the study: --storage sqlite:///<path>.db."
        )
    if code == sqlite3.SQLITE_CORRUPT:
        return (
            f"the study database {file} is damaged ({err.orig}); restore it from a copy, or start the "
            "study afresh in a new file."
        )
    if code == sqlite3.SQLITE_CANTOPEN and file.is_dir():
        return (
            f"{file} is a folder, not a study database; name a file in it, "
            f"e.g. --storage sqlite:///{file / 'study.db'}."
        )
    if code == sqlite3.SQLITE_CANTOPEN and not file.parent.is_dir():
        return (
            f"the folder {file.parent} of the study database {file} does not exist; create it, "
            "or name a file in another folder."
        )
    if code in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM):
        return (
            f"the study database {file} cannot be written ({err.orig}); allow writing to it and its "
            "folder, or name another file with --storage."
        )
    return f"the study database {file} cannot be opened ({err.orig}); name another file with --storage."


def _build(module: Any, spec: dict[str, Any], salt: tuple[int, ...] = ()) -> Any:
    """``{type: Name, **arguments}`` → ``module.Name(**arguments)``; a seed is mixed with ``salt``."""
    options = {k: v for k, v in spec.items() if k != "type"}
    kind = getattr(module, str(spec.get("type")), None)
    if not isinstance(kind, type):
        raise UserInputError(f"{module.__name__} has no class {spec.get('type')!r}.")
    if options.get("seed") is not None:
        options["seed"] = int(np.random.SeedSequence((options["seed"], *salt)).generate_state(1)[0])
    return kind(**options)


def run_sweep(
    words: Sequence[str],
    space: Space,
    trials: int,
    name: str,
    storage: str | None = None,
    worker: int = 0,
) -> optuna.Study:
    """Run trials until the study has ``trials`` finished ones; then report the best and write its config."""
    best_config(name, words)  # a refusal before the trials, not after them
    study = open_study(name, storage, space, worker)
    objective = Objective(words, space, trials, group=name)
    while True:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExperimentalWarning)  # the heartbeat again
            # running trials whose process died (no heartbeat for the grace period) → failed, and retried
            optuna.storages.fail_stale_trials(study)
        finished = len(study.get_trials(deepcopy=False, states=FINISHED))
        running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        if finished >= trials:
            break
        if finished + running >= trials:  # the last trials are under way elsewhere (or died): wait
            time.sleep(space.heartbeat)
            continue
        with quiet_own_failures():
            study.optimize(objective, n_trials=1, catch=(Surplus,))
    report(study, words, space, name)
    return study


def best_config(name: str, words: Sequence[str]) -> Path:
    """Where the study's best config goes: rewritten by every run of the study, but never over a config
    file the sweep itself reads."""
    path = SWEEPS / f"{name}-best.yaml"
    return check_output(path, config_files(list(words)), overwrite=True, option="the sweep's best config")


def report(study: optuna.Study, words: Sequence[str], space: Space, name: str) -> Path | None:
    """Print the best trial and write its whole config to ``logs/sweeps/<name>-best.yaml``."""
    finished = study.get_trials(deepcopy=False, states=FINISHED)
    pruned = sum(t.state == TrialState.PRUNED for t in finished)
    print(f"Study {name!r}: {len(finished)} trials finished ({pruned} pruned).")
    if not any(t.state == TrialState.COMPLETE for t in finished):
        print("No trial completed; no best config to write.")
        return None
    best = study.best_trial
    params = decode(space, best.params)
    print(f"Best {space.metric}: {best.value:.4f} (trial {best.number})")
    for key, value in params.items():
        print(f"  {key}: {_text(value)}")
    config = main([*words, *param_words(params)], run=False)
    resolved = yaml.safe_load(config.parser.dump(config.config, skip_none=False))
    logger = (resolved.get("trainer") or {}).get("logger")
    if isinstance(logger, dict) and isinstance(logger.get("init_args"), dict):
        logger["init_args"]["version"] = None  # a new version folder per run, not the trial's
    path = best_config(name, words)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# The best trial of sweep {name!r}: {space.metric} {best.value:.4f} (trial {best.number}).\n"
        f"#   python -m src.cli fit --config {path} --test_after_fit true\n"
    )
    # every process on the study writes it at the end: whole or not at all, never half of two; a full
    # disk is one sentence
    with written(path) as (partial,):
        partial.write_text(header + yaml.safe_dump(resolved, sort_keys=False))
    print(
        f"Best config written to {path}; run it: python -m src.cli fit --config {path} --test_after_fit true"
    )
    return path


def cli_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m src.apps.sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--space", required=True, help="the search space file (as digits.yaml here)")
    parser.add_argument("--trials", type=int, default=20, help="finished trials the study should have")
    parser.add_argument("--study", help="the study's name; left out, the space file's name")
    parser.add_argument("--storage", help="a database URL Optuna accepts; left out, logs/sweeps/<study>.db")
    parser.add_argument(
        "--worker", type=int, default=0, help="this process's number among several on a study"
    )
    options, words = parser.parse_known_args(argv)
    try:
        space = Space.read(options.space)
        name = options.study or Path(options.space).stem
        run_sweep(words, space, options.trials, name, options.storage, options.worker)
    except TrialStopped as err:
        if not err.said:
            print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    except UserInputError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from err
