"""Sweeps: Optuna searches, prunes, survives a killed process and shares a study between processes."""

import importlib.util
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import lightning as L
import optuna
import pytest
import sqlalchemy
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from optuna.trial import TrialState
from typing_extensions import override

import tests.test_trust as trust
from src.apps.cv import run_metrics
from src.apps.sweep import (
    OPEN_WAIT,
    Objective,
    Space,
    Surplus,
    TrialStopped,
    cli_main,
    decode,
    open_study,
    param_words,
    run_sweep,
    suggest,
)
from src.cli import main
from src.errors import UserInputError
from tests.conftest import BARE, CONFIGS, QUIET, ROOT

#: the shipped search space, beside this file
SPACE_FILE = Path(__file__).with_name("digits.yaml")
LR = "model.init_args.optimizer.init_args.lr"
HIDDEN = "model.init_args.net.init_args.hidden_sizes"
#: a tiny spiral run: 300 rows, a few epochs, no callbacks beyond what a test adds
TINY = [
    "--config",
    str(CONFIGS / "spiral.yaml"),
    "--data.num_samples=300",
    "--data.batch_size=32",
    "--trainer.max_epochs=4",
    *BARE,
    *QUIET,
]


def space(**changes: object) -> Space:
    params = {
        LR: {"type": "float", "low": 1e-5, "high": 1e-1, "log": True},
        HIDDEN: {"type": "categorical", "choices": [[32], [64, 64]]},
    }
    settings: dict = {
        "params": params,
        "metric": "val/acc",
        "direction": "maximize",
        "sampler": {"type": "TPESampler", "seed": 0},
        "pruner": {"type": "NopPruner"},
        "heartbeat": 1,
    }
    return Space(**{**settings, **changes})


@pytest.mark.slow
def test_a_sweep_finds_a_better_config_than_a_bad_start(workdir: Path, capsys) -> None:
    bad_start = [*TINY, f"--{LR}=1e-5"]  # learns next to nothing in 4 epochs
    baseline = run_metrics(main(["fit", *bad_start]))["val/acc"]
    words = [*bad_start, "--dashboard=src.extras.dashboard.Dashboard"]  # the HParams rows below
    study = run_sweep(words, space(), trials=4, name="better")

    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 4
    assert study.best_value > baseline + 0.1
    out = capsys.readouterr().out
    assert f"Best val/acc: {study.best_value:.4f} (trial {study.best_trial.number})" in out
    # each trial is its own run, and TensorBoard's HParams row (the dashboard's) holds the trial's values
    for trial in study.trials if importlib.util.find_spec("src.extras.dashboard") else []:
        from src.extras.dashboard.test_dashboard import Run, read_events, session_hparams

        log_dir = workdir / "logs" / "spiral" / "better" / f"trial{trial.number:03d}"
        hparams = session_hparams(Run(None, log_dir, read_events(log_dir)))  # type: ignore[arg-type]
        assert hparams["model.optimizer.lr"] == pytest.approx(trial.params[LR])
        assert hparams["model.net.hidden_sizes"] == str(decode(space(), trial.params)[HIDDEN])
    # the best config, written beside the study, runs as it is and gives the best trial's value again
    best = workdir / "logs" / "sweeps" / "better-best.yaml"
    written = yaml.safe_load(best.read_text())
    assert written["model"]["init_args"]["optimizer"]["init_args"]["lr"] == study.best_params[LR]
    again = main(["fit", "--config", str(best), *QUIET])
    assert run_metrics(again)["val/acc"] == pytest.approx(study.best_value)


@pytest.mark.slow
def test_a_trial_with_a_hopeless_learning_rate_is_pruned_early(workdir: Path) -> None:
    settings = space(
        metric="val/loss",
        direction="minimize",
        params={LR: {"type": "float", "low": 1e-8, "high": 1e-1, "log": True}},
        pruner={"type": "MedianPruner", "n_startup_trials": 1, "n_warmup_steps": 1},
    )
    study = open_study("prune", None, settings)
    study.enqueue_trial({LR: 0.02})
    study.enqueue_trial({LR: 1e-8})  # the weights barely move: val/loss stays at its start
    run_sweep([*TINY, "--trainer.max_epochs=6"], settings, trials=2, name="prune")

    good, hopeless = study.trials
    assert good.state == TrialState.COMPLETE
    assert sorted(good.intermediate_values) == list(range(6))
    assert hopeless.state == TrialState.PRUNED
    # stopped after the warm-up epoch, not run to the end
    assert sorted(hopeless.intermediate_values) == [0, 1]
    assert hopeless.intermediate_values[1] > good.intermediate_values[1]


@pytest.mark.slow
def test_with_cv_a_trials_value_is_the_mean_over_its_folds(workdir: Path) -> None:
    study = run_sweep([*TINY, "--trainer.max_epochs=2"], space(cv=2), trials=2, name="cv")
    for trial in study.trials:
        folder = workdir / "logs" / "spiral" / "cv" / f"trial{trial.number:03d}"
        folds = yaml.safe_load((folder / "summary.yaml").read_text())["val/acc"]
        assert trial.value == pytest.approx(folds["mean"])
        # reported fold by fold as the running mean, for the pruner
        assert trial.intermediate_values == pytest.approx({0: folds["fold0"], 1: folds["mean"]})
        assert folds["fold0"] != folds["fold1"]
    # the best config is the plain run, not one fold of it
    best = yaml.safe_load((workdir / "logs" / "sweeps" / "cv-best.yaml").read_text())
    assert (best["data"]["init_args"]["split"] or {}).get("folds") is None


def test_space_values_become_cli_words() -> None:
    activation = "model.init_args.net.init_args.activation"
    assert param_words({LR: 0.001, HIDDEN: [64, 32], activation: "tanh"}) == [
        f"--{LR}=0.001",
        f"--{HIDDEN}=[64, 32]",
        f"--{activation}=tanh",
    ]
    assert decode(space(), {LR: 0.5, HIDDEN: "[64, 64]"}) == {LR: 0.5, HIDDEN: [64, 64]}


def test_the_digits_space_names_keys_the_digits_config_accepts(workdir: Path) -> None:
    digits = Space.read(SPACE_FILE)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    params = {key: suggest(trial, key, spec) for key, spec in digits.params.items()}
    run = main(["--config", str(CONFIGS / "digits.yaml"), *param_words(params)], run=False)
    net = run.model.hparams["net"]["init_args"]
    assert net["hidden_sizes"] == params[HIDDEN]
    assert net["dropout"] == params["model.init_args.net.init_args.dropout"]
    # the net built is the one the trial asked for, not the config's
    widths = [layer.out_features for layer in run.model.net.modules() if isinstance(layer, torch.nn.Linear)]
    assert widths == [*params[HIDDEN], 10]
    assert digits.metric in ("val/acc", "val/f1", "val/loss")


def test_a_trial_asked_for_after_the_study_has_its_count_does_not_run(workdir: Path) -> None:
    """Two processes may both ask for the last trial; the later-numbered one stops before it runs."""
    study = optuna.create_study(direction="maximize")  # in memory: the rule needs no database
    objective = Objective(["--config", "no-such-file.yaml"], space(), trials=2, group="full")
    distribution = optuna.distributions.FloatDistribution(1e-5, 1e-1, log=True)
    study.add_trial(optuna.trial.create_trial(params={LR: 0.01}, distributions={LR: distribution}, value=0.5))
    running = study.ask()  # trial 1, under way in "another process"
    late = study.ask()  # trial 2: one finished and one running already make the count
    with pytest.raises(Surplus):
        objective(late)
    # trial 1 is within the count: it goes on to run (and fails here on the missing config file)
    with pytest.raises(TrialStopped):
        objective(running)


def test_a_bad_space_file_is_refused_in_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text("params:\n  model.init_args.net.init_args.dropout: {low: 0.0, high: 0.5}\n")
    with pytest.raises(UserInputError, match=r"init_args\.dropout needs type float, int or categorical"):
        Space.read(path)
    path.write_text("params: {}\nmetrik: val/acc\n")
    with pytest.raises(UserInputError, match="cannot be read"):
        Space.read(path)


# -- storage a study cannot be opened in --------------------------------------------------------------


def study_file(path: Path, revision: str | None = None) -> Path:
    """A real study database; ``revision`` overwrites its schema version (another Optuna's file)."""
    optuna.create_study(study_name="old", storage=f"sqlite:///{path}")
    if revision is not None:
        with closing(sqlite3.connect(path)) as connection, connection:
            connection.execute("UPDATE alembic_version SET version_num = ?", (revision,))
    return path


def damaged(tmp: Path) -> Path:
    path = study_file(tmp / "damaged.db")
    data = bytearray(path.read_bytes())
    data[100:4000] = bytes(3900)  # page 1 after the header: the table of tables
    path.write_bytes(bytes(data))
    return path


def written(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def file_url(path: Path) -> tuple[str, str]:
    """A SQLite URL, and the file the error should name."""
    return f"sqlite:///{path}", str(path)


def read_only(tmp: Path) -> tuple[str, str]:
    # what chmod a-w does for a user who is not root (tests may run as root, who may write anyway)
    path = study_file(tmp / "read-only.db")
    return f"sqlite:///file:{path}?mode=ro&uri=true", str(path)


def url_only(storage: str) -> tuple[str, str]:
    return storage, storage


#: case → (makes the storage in a scratch folder: its URL and what the error names; what the error says)
UNUSABLE: dict[str, tuple[Callable[[Path], tuple[str, str]], str]] = {
    "damaged": (lambda tmp: file_url(damaged(tmp)), "is damaged (database disk image is malformed)"),
    "text": (
        lambda tmp: file_url(written(tmp / "notes.txt", b"not a database\n" * 50)),
        "not a SQLite database",
    ),
    "bytes": (
        lambda tmp: file_url(written(tmp / "random.bin", bytes(range(256)) * 32)),
        "not a SQLite database",
    ),
    "missing folder": (lambda tmp: file_url(tmp / "nope" / "study.db"), "does not exist; create it"),
    "folder": (lambda tmp: file_url(tmp), "is a folder, not a study database; name a file in it"),
    "read-only": (read_only, "cannot be written (attempt to write a readonly database)"),
    "older schema": (
        lambda tmp: url_only(f"sqlite:///{study_file(tmp / 'old.db', 'v3.0.0.a')}"),
        "optuna storage upgrade --storage sqlite:///",
    ),
    "newer schema": (
        lambda tmp: url_only(f"sqlite:///{study_file(tmp / 'new.db', 'v99.0.0')}"),
        "pip install -U optuna",
    ),
    "unknown scheme": (lambda tmp: url_only("foo://x"), "is not a database URL SQLAlchemy can use"),
    "not a URL": (lambda tmp: url_only(str(tmp / "study.db")), "is not a database URL SQLAlchemy can use"),
}


def refusal(capsys: pytest.CaptureFixture[str], storage: str) -> str:
    """What ``python -m src.apps.sweep ... --storage <storage>`` prints on stderr; it must exit with 2."""
    with pytest.raises(SystemExit) as stop:
        cli_main(["--space", str(SPACE_FILE), "--trials=0", f"--storage={storage}"])
    assert stop.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("case", UNUSABLE)
def test_a_storage_the_study_cannot_be_opened_in_is_refused_in_one_sentence(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    make, says = UNUSABLE[case]
    storage, named = make(workdir)
    capsys.readouterr()  # Optuna's log lines while the file was made
    # at once: none of the retries that processes racing to create a new file's tables are given
    retries: list[float] = []
    monkeypatch.setattr(time, "sleep", retries.append)
    err = refusal(capsys, storage)
    assert retries == []
    assert err.startswith("error: ")
    assert err.count("\n") == 1, err
    assert says in err
    assert named in err


#: holds an exclusive lock on the database it is given until it is killed (or 20 s have passed)
HOLD = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(20)
"""


def test_a_study_another_process_holds_locked_is_refused_after_a_short_wait(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused by the check before the study is opened, whose connection waits OPEN_WAIT seconds for a
    lock (SQLite's busy timeout), not by opening the study, which allows 120."""
    path = study_file(workdir / "locked.db")
    engines: list[dict] = []
    create_engine = sqlalchemy.create_engine

    def recorded(*args: object, **kwargs: object) -> sqlalchemy.engine.Engine:
        engines.append(kwargs)
        return create_engine(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlalchemy, "create_engine", recorded)
    monkeypatch.setattr(optuna.storages, "RDBStorage", None)  # opening the study would fail otherwise
    with subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == "locked\n"
            capsys.readouterr()
            err = refusal(capsys, f"sqlite:///{path}")
        finally:
            holder.kill()
    assert engines == [{"connect_args": {"timeout": OPEN_WAIT}}]
    assert err == (
        f"error: the study database {path} is locked by another process (waited {OPEN_WAIT} s); let that "
        "process finish or end its open transaction, then run the sweep again.\n"
    )


# -- crashes and several processes ----------------------------------------------------------------


def sweep_command(tmp: Path, trials: int, worker: int = 0, *words: str) -> list[str]:
    (tmp / "space.yaml").write_text(yaml.safe_dump({**space().__dict__, "pruner": {"type": "NopPruner"}}))
    return [
        sys.executable,
        "-m",
        "src.apps.sweep",
        "--space",
        str(tmp / "space.yaml"),
        f"--trials={trials}",
        f"--worker={worker}",
        *TINY,
        "--trainer.max_epochs=3",
        *words,
    ]


class AfterTheOtherProcessStarts(Callback):
    """Holds a trial's training until a trial of another process has started (at most ``timeout`` s).

    A tiny trial takes a fraction of a second: without this, the first process to open the study can
    run every trial before the second one has imported its libraries.
    """

    def __init__(self, storage: str, timeout: float = 60.0) -> None:
        self.storage = storage
        self.timeout = timeout

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            trials = optuna.load_study(study_name="space", storage=self.storage).trials
            if len({t.user_attrs["process"] for t in trials if "process" in t.user_attrs}) > 1:
                return
            time.sleep(0.1)


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def load(tmp: Path) -> optuna.Study:
    return optuna.load_study(study_name="space", storage=f"sqlite:///{tmp / 'logs' / 'sweeps' / 'space.db'}")


@pytest.mark.slow
def test_a_killed_sweep_resumes_to_the_requested_count_without_duplicates(tmp_path: Path) -> None:
    command = sweep_command(tmp_path, trials=4)  # three chances to find a trial running
    first = subprocess.Popen(
        command, cwd=tmp_path, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        # wait until one trial has finished and the next one is running, then kill without warning
        while time.monotonic() < deadline and first.poll() is None:
            # the first trial's folder: the study's tables exist, this process may open them
            if (tmp_path / "logs" / "spiral" / "space" / "trial000").exists():
                trials = load(tmp_path).trials
                # a trial finished, and the next one has its values: it is training
                if any(t.state == TrialState.COMPLETE for t in trials) and any(
                    t.state == TrialState.RUNNING and t.params for t in trials
                ):
                    break
            time.sleep(0.2)
        assert first.poll() is None, "the sweep ended before it could be killed"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    killed = [t for t in load(tmp_path).trials if t.state == TrialState.RUNNING]
    assert len(killed) == 1

    again = subprocess.run(
        command, cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=180
    )
    assert again.returncode == 0, again.stderr[-2000:]
    trials = load(tmp_path).trials
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 4
    # the interrupted trial is marked failed and run again with its values
    interrupted = next(t for t in trials if t.number == killed[0].number)
    assert interrupted.state == TrialState.FAIL
    retried = [t for t in finished if t.system_attrs.get("failed_trial") == interrupted.number]
    assert len(retried) == 1
    assert retried[0].params == killed[0].params
    assert len({t.params[LR] for t in finished}) == 4  # no values ran twice
    assert "Best val/acc" in again.stdout


@pytest.mark.slow
def test_two_processes_share_one_study_and_stop_at_the_requested_count(tmp_path: Path) -> None:
    processes = [
        subprocess.Popen(
            sweep_command(
                tmp_path,
                4,
                worker,
                "--trainer.callbacks+=src.apps.sweep.test_sweep.AfterTheOtherProcessStarts",
                f"--trainer.callbacks.storage=sqlite:///{tmp_path / 'logs' / 'sweeps' / 'space.db'}",
            ),
            cwd=tmp_path,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for worker in (0, 1)
    ]
    outputs = [p.communicate(timeout=180) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], [err[-2000:] for _, err in outputs]
    trials = load(tmp_path).trials
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 4
    assert len({t.params[LR] for t in finished}) == 4
    assert len({t.user_attrs["process"] for t in finished}) == 2  # both processes did some of the work
    assert (tmp_path / "logs" / "sweeps" / "space-best.yaml").is_file()
    assert not list((tmp_path / "logs" / "sweeps").glob("*.partial"))
    runs = sorted(p.name for p in (tmp_path / "logs" / "spiral" / "space").iterdir())
    assert runs == [f"trial{t.number:03d}" for t in sorted(trials, key=lambda t: t.number) if t.user_attrs]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("words", "changes", "sentence"),
    [
        (["--data.batch_size=0"], {}, "stopped: data.batch_size=0 must be at least 1."),
        ([], {"metric": "val/nope"}, "stopped: the sweep's metric 'val/nope' is not logged; the run logs ["),
        (["--data.batch_size=0"], {"cv": 2}, "error: data.batch_size=0 must be at least 1."),
    ],
    ids=["refused-as-the-run-is-built", "refused-while-training", "refused-by-a-folds-run"],
)
def test_a_failed_trial_is_one_sentence_and_a_non_zero_exit(
    tmp_path: Path, words: list[str], changes: dict, sentence: str
) -> None:
    """As a user runs it: one sentence on stderr (the trial's, said once), not Optuna's report of the
    failed trial with its chained traceback, and exit status 2."""
    command = sweep_command(tmp_path, 1, 0, *words)
    settings = {**space().__dict__, "pruner": {"type": "NopPruner"}, **changes}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(settings))
    done = subprocess.run(
        command, cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "failed with" not in done.stderr  # Optuna's report of the trial
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    assert sentence in errors[0]
    if not changes.get("cv"):
        assert errors[0].startswith("error: trial 0 (--model.init_args.")  # its values, as CLI words
        assert "--model.init_args.optimizer.init_args.lr=" in errors[0]


def test_a_sweep_never_writes_its_best_config_over_a_config_it_reads(workdir: Path, capsys) -> None:
    """As no output of the core lands on an input (tests/test_trust.py)."""
    mine = workdir / "logs" / "sweeps" / "digits-best.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text((CONFIGS / "spiral.yaml").read_text())
    words = ["--space", str(SPACE_FILE), "--trials=1", "--config", str(mine)]
    sentence = trust.refusal(cli_main, words, capsys)
    assert sentence.startswith("the sweep's best config='logs/sweeps/digits-best.yaml' is")
    assert mine.read_text() == (CONFIGS / "spiral.yaml").read_text()
    assert sorted(p.name for p in mine.parent.iterdir()) == ["digits-best.yaml"]  # no study was opened
