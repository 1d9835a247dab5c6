"""Nothing lost, nothing run: every entry point that opens a checkpoint or writes a file, tried with the
hostile inputs that once got through (a checkpoint naming code at any depth, files that are not
checkpoints, outputs over inputs, devices, existing files and a killed writer's leftovers)."""

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

import src.cli
import src.settings
from src.checkpoints import load_checkpoint
from src.cli import main
from src.errors import UserInputError
from src.models import Classifier
from src.predict import Predictor
from tests.conftest import CONFIGS, PLANTED, QUIET, Trained

SPIRAL = ["--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=200", "--trainer.max_epochs=1"]


def entry_points(workdir: Path) -> dict[str, Callable[[str], None]]:
    """Each way the core opens a checkpoint, as a user calls it; a refusal raises SystemExit or
    UserInputError. An app that opens checkpoints holds its own entry point to the same proofs in its folder
    (:func:`assert_names_no_code`, :func:`assert_refused_as_the_core_refuses`)."""

    def config_file(path: str) -> None:  # ckpt_path from a config file, not from the words
        (workdir / "resume.yaml").write_text(f"ckpt_path: {path}\n")
        main(["fit", *SPIRAL, "--config", str(workdir / "resume.yaml"), *QUIET])

    return {
        "predict": lambda path: main(["predict", "--ckpt_path", path, *QUIET]),
        "validate": lambda path: main(["validate", "--ckpt_path", path, *QUIET]),
        "test": lambda path: main(["test", "--ckpt_path", path, *QUIET]),
        "fit --ckpt_path": lambda path: main(["fit", *SPIRAL, "--ckpt_path", path, *QUIET]),
        "fit, ckpt_path in a config file": config_file,
        "Predictor": lambda path: Predictor.from_checkpoint(path) and None,
        "load_from_checkpoint": lambda path: Classifier.load_from_checkpoint(path) and None,
    }


ENTRY_POINTS = list(entry_points(Path()))


def refusal(open_: Callable[[Any], None], given: Any, capsys: pytest.CaptureFixture[str]) -> str:
    """The one sentence an entry point answers ``given`` with (stderr for commands, the error in Python)."""
    capsys.readouterr()
    with pytest.raises((SystemExit, UserInputError)) as caught:
        open_(given)
    if isinstance(caught.value, UserInputError):
        return str(caught.value)
    assert caught.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines  # one sentence, no traceback
    assert lines[0].startswith("error: ")
    return lines[0].removeprefix("error: ")


def plant(checkpoint: dict, where: str) -> None:
    """Name the planted code at ``where`` in a checkpoint's settings."""
    hparams, config = checkpoint["hyper_parameters"], checkpoint["config"]
    named = {"class_path": f"{PLANTED}.Optimizer", "init_args": {"lr": 0.1}}
    if where == "the model class":
        hparams["_class_path"] = f"{PLANTED}.Optimizer"
    elif where == "the optimizer in the hyperparameters":
        hparams["optimizer"] = named
    elif where == "deep in a list":
        hparams["extra"] = [1, {"inner": {"deeper": [named]}}]
    elif where == "the scheduler in the settings":
        config["model"]["init_args"]["scheduler"] = named
    elif where == "the logger in the settings":
        config["trainer"]["logger"] = {"class_path": f"{PLANTED}.Optimizer"}
    elif where == "a plain string a callable takes":
        hparams["optimizer"] = f"{PLANTED}.function"
    elif where == "the instantiator":
        hparams["_instantiator"] = f"{PLANTED}.function"
    elif where == "a YAML file the parser reads":
        Path("planted.yaml").write_text(f"class_path: {PLANTED}.Optimizer\ninit_args: {{lr: 0.1}}\n")
        hparams["optimizer"] = "planted.yaml"
        config["model"]["init_args"]["optimizer"] = str(Path("planted.yaml").absolute())
    elif where == "a YAML text the parser reads":
        hparams["optimizer"] = f"class_path: {PLANTED}.Optimizer\ninit_args: {{lr: 0.1}}"
        config["model"]["init_args"]["optimizer"] = f"{{class_path: {PLANTED}.Optimizer}}"
        config["trainer"]["callbacks"] = f"[{{class_path: {PLANTED}.Optimizer}}]"
    else:
        raise ValueError(where)


PLACES = [
    "the model class",
    "the optimizer in the hyperparameters",
    "deep in a list",
    "the scheduler in the settings",
    "the logger in the settings",
    "a plain string a callable takes",
    "the instantiator",
    "a YAML text the parser reads",
    "a YAML file the parser reads",
]


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("where", PLACES)
def test_a_checkpoint_names_no_code_at_any_depth_at_any_entry_point(
    trained: Trained, planted: Path, workdir: Path, capsys, caplog, entry: str, where: str
) -> None:
    if where == "the logger in the settings" and entry not in ("Predictor", "load_from_checkpoint"):
        open_ = entry_points(workdir)[entry]
        assert_foreign_logger_left_off(
            open_, entry.startswith("fit"), trained, planted, workdir, capsys, caplog
        )
        return
    assert_names_no_code(entry_points(workdir)[entry], trained, planted, workdir, capsys, where)


def assert_foreign_logger_left_off(
    open_: Callable[[str], None],
    resumes: bool,
    trained: Trained,
    planted: Path,
    workdir: Path,
    capsys,
    caplog,
) -> None:
    """A command takes a carried logger only where it trusts the class (a run's own choice, never what the
    model needs): ``open_`` leaves a foreign one off in one line and goes on without it, or, where it
    ``resumes`` a fit, takes only its run name and refuses these words' other net in its own sentence;
    nothing planted is imported."""
    checkpoint = load_checkpoint(trained.checkpoint)
    plant(checkpoint, "the logger in the settings")
    path = workdir / "foreign.ckpt"
    torch.save(checkpoint, path)
    if resumes:
        assert "hidden_sizes" in refusal(open_, str(path), capsys)
    else:
        with caplog.at_level(logging.INFO):
            open_(str(path))
        said = [r.getMessage() for r in caplog.records if PLANTED in r.getMessage()]
        assert said == [
            f"--ckpt_path {path}: its run's trainer.logger {PLANTED}.Optimizer is code outside this project "
            "that a checkpoint does not name by itself; it is left off."
        ]
    assert PLANTED not in sys.modules
    assert not planted.exists()


def assert_names_no_code(
    open_: Callable[[str], None], trained: Trained, planted: Path, workdir: Path, capsys, where: str
) -> None:
    """``open_`` refuses a copy of ``trained``'s checkpoint that names the planted code at ``where``, in one
    sentence, and imports nothing."""
    checkpoint = load_checkpoint(trained.checkpoint)
    plant(checkpoint, where)
    path = workdir / "foreign.ckpt"
    torch.save(checkpoint, path)
    sentence = refusal(open_, str(path), capsys)
    assert sentence.startswith(f"checkpoint '{path}' names '{PLANTED}.")
    assert "code outside this project that is not imported on a checkpoint's word" in sentence
    assert PLANTED not in sys.modules
    assert not planted.exists()


def test_a_class_the_user_names_is_imported_and_used(trained: Trained, planted: Path, workdir) -> None:
    """The rule refuses a checkpoint's word, not the user's: named in the user's config, the class runs."""
    checkpoint = load_checkpoint(trained.checkpoint)
    plant(checkpoint, "the optimizer in the hyperparameters")
    torch.save(checkpoint, workdir / "mine.ckpt")
    (workdir / "mine.yaml").write_text(
        "model:\n  init_args:\n    optimizer:\n"
        f"      class_path: {PLANTED}.Optimizer\n      init_args: {{lr: 0.1}}\n"
    )
    folder = trained.checkpoint.parent.parent
    words = ["--ckpt_path", str(workdir / "mine.ckpt"), "--config", str(folder / "config.yaml")]
    words += ["--config", str(workdir / "mine.yaml")]
    run = main(["validate", *words, *QUIET])
    assert type(run.model.optimizer(run.model.parameters())).__name__ == "Optimizer"
    assert planted.exists()  # imported: the user asked for it


def test_a_checkpoints_own_file_name_names_no_class(
    trained: Trained, planted: Path, workdir: Path, capsys
) -> None:
    """``planted_trust_probe.ckpt`` on the command line is a path the user gave, not a class they named."""
    checkpoint = load_checkpoint(trained.checkpoint)
    checkpoint["config"]["model"]["init_args"]["optimizer"] = {"class_path": f"{PLANTED}.ckpt"}
    torch.save(checkpoint, workdir / f"{PLANTED}.ckpt")
    sentence = refusal(main, ["predict", "--ckpt_path", f"{PLANTED}.ckpt", *QUIET], capsys)
    assert f"names '{PLANTED}.ckpt' (at config.model.init_args.optimizer.class_path)" in sentence
    assert not planted.exists()


def test_a_checkpoint_says_nothing_of_where_a_later_run_writes(
    trained: Trained, rows: Path, workdir: Path
) -> None:
    """An output path, callbacks beyond the sections or a logger folder written into a checkpoint are not
    applied: the run's choices it carries say what runs, never where it writes."""
    checkpoint = load_checkpoint(trained.checkpoint)
    victim, elsewhere = workdir / "victim.csv", workdir / "elsewhere"
    victim.write_text("mine\n")
    checkpoint["config"]["output"] = str(victim)
    checkpoint["config"]["overwrite"] = True
    checkpoint["config"]["prediction_writer"] = {"init_args": {"output_path": str(victim), "overwrite": True}}
    keeper = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"dirpath": "x"}}
    checkpoint["config"]["trainer"]["callbacks"] = [keeper]
    checkpoint["config"]["trainer"]["logger"] = {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": str(elsewhere), "name": "theirs"},
    }
    (workdir / "run" / "checkpoints").mkdir(parents=True)
    path = workdir / "run" / "checkpoints" / "last.ckpt"
    torch.save(checkpoint, path)
    run = main(predict_words(path, rows))
    assert victim.read_text() == "mine\n"
    assert (workdir / "run" / "predictions.csv").is_file()
    assert not elsewhere.exists()
    assert run.trainer.logger is None  # predict logs nothing: neither the checkpoint's logger nor its folder


def test_load_from_checkpoint_loads_the_projects_checkpoints_and_refuses_a_url(
    trained: Trained,
) -> None:
    model = Classifier.load_from_checkpoint(trained.checkpoint)
    expected = load_checkpoint(trained.checkpoint)["state_dict"]
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)
    # Lightning's own loader would read an http(s) URL with weights_only=False
    with pytest.raises(UserInputError, match="is a URL; download it and pass the local file"):
        Classifier.load_from_checkpoint("http://127.0.0.1:9/model.ckpt")


class Payload:
    """Pickles to a call that would leave a marker file: proof that loading ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def bad_checkpoint(kind: str, folder: Path) -> tuple[Path, str]:
    """A file (or folder) that is not a checkpoint of this project, and the sentence it must get."""
    path = folder / f"{kind}.ckpt"
    if kind == "empty":
        path.touch()
        return path, "is empty (0 bytes); pass a checkpoint that was saved whole."
    if kind == "text":
        path.write_text("model: {}\n")
        return path, "is not a checkpoint file (neither torch.save's archive nor its older format)."
    if kind == "pickle that runs code":
        path.write_bytes(__import__("pickle").dumps(Payload(folder / "code-ran")))
        return path, "is a pickle, not a checkpoint saved by torch.save; a pickle can run code when loaded"
    if kind == "checkpoint that runs code":
        torch.save({"state_dict": {}, "payload": Payload(folder / "code-ran")}, path)
        return path, "holds objects other than tensors and plain data, which would run code when loaded"
    if kind == "truncated":
        torch.save({"state_dict": {"w": torch.zeros(1000)}}, path)
        path.write_bytes(path.read_bytes()[:300])
        return path, "is damaged or truncated (its archive cannot be read); pass a whole checkpoint."
    if kind == "folder":
        path.mkdir()
        return path, "is a folder; pass the path of a .ckpt file inside it."
    if kind == "missing":
        return path, "does not exist; pass the path of a .ckpt file."
    if kind == "a class this project lacks":
        torch.save({"state_dict": {}, "hyper_parameters": {"_class_path": "src.nonexistent.Task"}}, path)
        what = (
            "names 'src.nonexistent.Task' (at hyper_parameters._class_path), which this project does not have"
        )
        return path, what
    raise ValueError(kind)


KINDS = [
    "empty",
    "text",
    "pickle that runs code",
    "checkpoint that runs code",
    "truncated",
    "folder",
    "missing",
    "a class this project lacks",
]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_file_that_is_no_checkpoint_gets_the_same_sentence_at_every_entry_point(
    workdir: Path, capsys, kind: str
) -> None:
    path, why = bad_checkpoint(kind, workdir)
    sentences = {entry: refusal(open_, str(path), capsys) for entry, open_ in entry_points(workdir).items()}
    assert set(sentences.values()) == {sentences["Predictor"]}, sentences
    assert sentences["Predictor"].startswith(f"checkpoint '{path}' {why}")
    assert not (workdir / "code-ran").exists()
    assert not (workdir / "logs").exists()


def assert_refused_as_the_core_refuses(
    open_: Callable[[str], None], workdir: Path, capsys, kind: str
) -> None:
    """``open_`` answers a file of ``kind`` that is no checkpoint with the very sentence the core's
    :class:`Predictor` does, runs nothing and starts no run folder."""
    path, why = bad_checkpoint(kind, workdir)
    sentence = refusal(open_, str(path), capsys)
    assert sentence == refusal(Predictor.from_checkpoint, str(path), capsys)
    assert sentence.startswith(f"checkpoint '{path}' {why}")
    assert not (workdir / "code-ran").exists()
    assert not (workdir / "logs").exists()


# resuming into its own run folder, Lightning notes that the checkpoint folder is not empty: it is meant to be
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty:UserWarning")
def test_resuming_from_last_when_last_is_no_checkpoint(workdir: Path, capsys) -> None:
    """``--ckpt_path last`` is found by Lightning and read through the project's checkpoint IO."""
    folder = workdir / "logs" / "spiral" / "v" / "checkpoints"
    folder.mkdir(parents=True)
    path, why = bad_checkpoint("pickle that runs code", folder)
    path.rename(folder / "last.ckpt")
    words = ["fit", *SPIRAL, "--trainer.logger.init_args.version=v", "--ckpt_path", "last", *QUIET]
    sentence = refusal(main, words, capsys)
    assert sentence.startswith(f"checkpoint '{folder / 'last.ckpt'}' {why}")
    assert not (workdir / "code-ran").exists()


# -- the files the project writes -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def rows(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """New rows to predict, in a folder of their own (the tests look at what lands in theirs)."""
    path = tmp_path_factory.mktemp("rows") / "new.csv"
    trained.raw_rows("val").to_csv(path, index=False)
    return path


def predict_words(checkpoint: Path, rows: Path, *more: str) -> list[str]:
    return ["predict", "--ckpt_path", str(checkpoint), f"--data.predict_path={rows}", *more, *QUIET]


def fingerprint(path: Path) -> tuple[bool, bytes | None]:
    return path.is_file(), path.read_bytes() if path.is_file() else None


@pytest.mark.slow
@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("target", ["the checkpoint", "the data file", "the config file", "a link to it"])
def test_no_output_lands_on_an_input_even_when_overwriting(
    trained: Trained, workdir: Path, capsys, target: str, overwrite: bool
) -> None:
    checkpoint = workdir / "model.ckpt"
    checkpoint.write_bytes(trained.checkpoint.read_bytes())
    data = workdir / "new.csv"
    trained.raw_rows("val").to_csv(data, index=False)
    config = workdir / "run.yaml"  # the run's own settings, as a config file of the user's
    config.write_text((trained.checkpoint.parent.parent / "config.yaml").read_text())
    (workdir / "link.ckpt").symlink_to(checkpoint)
    output = {"the checkpoint": checkpoint, "the data file": data, "the config file": config}.get(
        target, workdir / "link.ckpt"
    )
    before = {p: fingerprint(p) for p in (checkpoint, data, config)}
    predict = [
        "predict", "--ckpt_path", str(checkpoint), "--config", str(config), f"--data.predict_path={data}",
        f"--output={output}", f"--overwrite={str(overwrite).lower()}", *QUIET,
    ]  # fmt: skip
    assert "an input of this run; name another file." in refusal(main, predict, capsys)
    assert {p: fingerprint(p) for p in before} == before


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["a pipe", "/dev/full"])
def test_only_regular_files_are_written(
    trained: Trained, rows: Path, workdir: Path, capsys, kind: str
) -> None:
    output = special_file(workdir, kind)
    device = output.stat()
    words = predict_words(trained.checkpoint, rows, f"--output={output}", "--overwrite=true")
    assert refusal(main, words, capsys) == (
        f"--output={str(output)!r} is not a regular file (a device, pipe or socket); name a file."
    )
    assert (output.stat().st_ino, output.stat().st_mode) == (device.st_ino, device.st_mode)


def special_file(folder: Path, kind: str) -> Path:
    """A pipe made in ``folder``, or the system's /dev/full: files that are not regular files."""
    if kind == "a pipe":
        output = folder / "pipe"
        os.mkfifo(output)
        return output
    if not Path("/dev/full").exists():
        pytest.skip("this system has no /dev/full")
    return Path("/dev/full")


@pytest.mark.slow
def test_an_existing_file_is_replaced_only_when_asked(
    trained: Trained, rows: Path, workdir: Path, capsys
) -> None:
    notes = workdir / "notes.txt"
    notes.write_text("my notes\n")
    assert refusal(main, predict_words(trained.checkpoint, rows, f"--output={notes}"), capsys).endswith(
        "exists; pass --overwrite true to replace it, or name another file."
    )
    assert notes.read_text() == "my notes\n"
    assert sorted(p.name for p in workdir.iterdir()) == ["notes.txt"]
    main(predict_words(trained.checkpoint, rows, f"--output={notes}", "--overwrite=true"))
    assert pd.read_csv(notes).columns[:2].tolist() == ["row", "prediction"]


@pytest.mark.slow
def test_predicts_default_file_is_not_replaced_by_the_next_predict(
    trained: Trained, rows: Path, workdir: Path, capsys
) -> None:
    copy_ = workdir / "run" / "checkpoints" / "last.ckpt"
    copy_.parent.mkdir(parents=True)
    copy_.write_bytes(trained.checkpoint.read_bytes())
    main(predict_words(copy_, rows))
    default = workdir / "run" / "predictions.csv"
    first = default.read_bytes()
    sentence = refusal(main, predict_words(copy_, rows), capsys)
    assert sentence == (
        f"predict's default output={str(default)!r} exists; pass --overwrite true to replace it, or name "
        "another file."
    )
    assert default.read_bytes() == first


@pytest.mark.slow
def test_a_killed_writers_leftovers_are_removed_by_the_next_write(
    trained: Trained, rows: Path, workdir: Path
) -> None:
    alive = plant_leftovers(workdir)
    main(predict_words(trained.checkpoint, rows, f"--output={workdir / 'predictions.csv'}"))
    assert sorted(p.name for p in workdir.iterdir()) == sorted([alive.name, "predictions.csv"])


def plant_leftovers(folder: Path) -> Path:
    """Half-written files in ``folder`` of a process that is gone (a graph's and a CSV file's), and one of a
    process that lives (pid 1: a write under way elsewhere), which is returned."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    pid = int(gone.stdout)
    leftovers = [folder / f".model.partial-{pid}.onnx", folder / f".predictions.partial-{pid}.csv"]
    alive = folder / ".other.partial-1.onnx"
    for path in [*leftovers, alive]:
        path.write_bytes(b"half a file")
    return alive


def test_a_failed_predict_leaves_no_file(
    trained: Trained, rows: Path, workdir: Path, monkeypatch, capsys
) -> None:
    """Written whole or not at all: a CSV writer that dies halfway leaves neither file nor leftover."""

    def dies(self: pd.DataFrame, path: Path, **kwargs: object) -> None:
        Path(path).write_text("row,prediction\n0,")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", dies)
    words = predict_words(trained.checkpoint, rows, f"--output={workdir / 'out.csv'}")
    assert refusal(main, words, capsys).startswith(
        f"cannot write {str(workdir / 'out.csv')!r}: no space left"
    )
    assert list(workdir.iterdir()) == []


def test_the_projects_own_defaults_are_an_input_too(
    trained: Trained, rows: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    defaults = workdir / "defaults.yaml"  # a copy: were the rule broken, the test breaks only its copy
    defaults.write_text(src.cli.DEFAULTS.read_text())
    monkeypatch.setattr(src.cli, "DEFAULTS", defaults)
    monkeypatch.setattr(src.settings, "DEFAULTS", defaults)
    words = predict_words(trained.checkpoint, rows, f"--output={defaults}", "--overwrite=true")
    assert refusal(main, words, capsys).endswith("an input of this run; name another file.")
    assert defaults.read_text() == CONFIGS.joinpath("defaults.yaml").read_text()


def test_a_link_is_not_replaced_and_a_folder_that_refuses_files_is_said_first(
    trained: Trained, rows: Path, workdir: Path, capsys
) -> None:
    (workdir / "theirs.csv").write_text("theirs\n")
    (workdir / "link.csv").symlink_to(workdir / "theirs.csv")
    link = f"--output={workdir / 'link.csv'}"
    words = predict_words(trained.checkpoint, rows, link, "--overwrite=true")
    assert refusal(main, words, capsys).endswith("is a symbolic link; name the file itself.")
    assert (workdir / "link.csv").is_symlink()
    assert (workdir / "theirs.csv").read_text() == "theirs\n"
    if Path("/proc").is_dir():  # nothing can be created there, not even by root
        words = predict_words(trained.checkpoint, rows, "--output=/proc/predictions.csv")
        assert "cannot be written: '/proc' refuses new files" in refusal(main, words, capsys)


def test_a_url_as_ckpt_path_in_a_config_file_is_one_sentence(workdir: Path, capsys) -> None:
    (workdir / "resume.yaml").write_text("ckpt_path: http://127.0.0.1:9/model.ckpt\n")
    words = ["fit", *SPIRAL, "--config", str(workdir / "resume.yaml"), *QUIET]
    assert refusal(main, words, capsys).startswith("checkpoint 'http://127.0.0.1:9/model.ckpt' is a URL")


def test_an_output_path_spelled_like_a_class_names_no_class(
    trained: Trained, rows: Path, planted: Path, workdir: Path, capsys
) -> None:
    checkpoint = load_checkpoint(trained.checkpoint)
    plant(checkpoint, "the scheduler in the settings")
    torch.save(checkpoint, workdir / "theirs.ckpt")
    output = f"--output={workdir / 'out' / f'{PLANTED}.Optimizer'}"
    sentence = refusal(main, predict_words(workdir / "theirs.ckpt", rows, output), capsys)
    assert f"names '{PLANTED}.Optimizer'" in sentence
    assert not planted.exists()
