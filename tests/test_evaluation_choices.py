"""An evaluation of a checkpoint (``validate``, ``test``, ``predict`` with ``--ckpt_path``) keeps the choices
its run was fitted with: its logger and the callback sections it had on or off, unless the words say
otherwise; a carried section whose class is untrusted or gone is left off, in one line."""

import logging
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import EarlyStopping

from src.cli import DEFAULTS, main
from tests.conftest import BARE, CONFIGS, ONE_PASS, QUIET

SPIRAL = ["--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=300", *ONE_PASS, *BARE, *QUIET]
CSV = ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.init_args.save_dir=logs"]


def section_classes() -> set[str]:
    """The classes ``configs/defaults.yaml`` turns on, one per callback section."""
    loaded = yaml.safe_load(DEFAULTS.read_text())
    return {
        value["class_path"] for value in loaded.values() if isinstance(value, dict) and "class_path" in value
    }


def class_path(thing: object) -> str:
    return f"{type(thing).__module__}.{type(thing).__qualname__}"


@pytest.fixture
def csv_run(workdir: Path) -> Path:
    """The best checkpoint of a run fitted with Lightning's CSVLogger and every section off."""
    fit = main(["fit", *SPIRAL, *CSV, "--trainer.max_epochs=2"])
    (checkpoint,) = (Path(str(fit.trainer.log_dir)) / "checkpoints").glob("*.ckpt")  # Lightning's own
    return checkpoint


def test_an_evaluation_keeps_the_runs_logger_and_sections(csv_run: Path, workdir: Path) -> None:
    run = csv_run.parent.parent
    tested = main(["test", f"--ckpt_path={csv_run}", *QUIET])
    assert class_path(tested.trainer.logger) == "lightning.pytorch.loggers.csv_logs.CSVLogger"
    # inside the run folder, whatever the logger
    assert Path(str(tested.trainer.log_dir)).resolve() == (run / f"test-{csv_run.stem}").resolve()
    assert (run / f"test-{csv_run.stem}" / "metrics.csv").is_file()
    assert not list(run.rglob("events.out.tfevents.*"))
    # every section the run had off stays off, whatever configs/defaults.yaml turns on
    on = {class_path(callback) for callback in tested.trainer.callbacks}  # type: ignore[attr-defined]
    assert section_classes() - {"src.callbacks.PredictionWriter"}
    assert not on & section_classes()


def test_words_given_with_the_checkpoint_win(csv_run: Path) -> None:
    words = [
        "--early_stopping=lightning.pytorch.callbacks.EarlyStopping",
        "--early_stopping.monitor=val/loss",
    ]
    chosen = main(["validate", f"--ckpt_path={csv_run}", *words, *QUIET])
    assert any(isinstance(c, EarlyStopping) for c in chosen.trainer.callbacks)  # type: ignore[attr-defined]
    tensorboard = "lightning.pytorch.loggers.TensorBoardLogger"
    logged = main(["validate", f"--ckpt_path={csv_run}", f"--trainer.logger={tensorboard}", *QUIET])
    assert class_path(logged.trainer.logger) == "lightning.pytorch.loggers.tensorboard.TensorBoardLogger"


def test_a_carried_section_that_is_gone_or_untrusted_is_left_off_in_one_line(
    csv_run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = torch.load(csv_run, weights_only=True)
    checkpoint["config"]["early_stopping"] = {"class_path": "src.no_such_module.Gone"}
    checkpoint["config"]["trainer"]["logger"] = {"class_path": "os.system"}
    planted = csv_run.with_name("planted.ckpt")
    torch.save(checkpoint, planted)
    with caplog.at_level(logging.INFO):
        run = main(["validate", f"--ckpt_path={planted}", *QUIET])
    said = [record.getMessage() for record in caplog.records if "it is left off" in record.getMessage()]
    assert said == [
        f"--ckpt_path {planted}: its run's trainer.logger os.system is code outside this project that a "
        "checkpoint does not name by itself; it is left off.",
        f"--ckpt_path {planted}: its run's early_stopping src.no_such_module.Gone is not in this project "
        "(an extra taken off?); it is left off.",
    ]
    # left off: configs/defaults.yaml's sections stand in for them
    defaults = yaml.safe_load(DEFAULTS.read_text())
    assert defaults["early_stopping"]["class_path"] == "lightning.pytorch.callbacks.EarlyStopping"
    assert any(isinstance(c, EarlyStopping) for c in run.trainer.callbacks)  # type: ignore[attr-defined]
