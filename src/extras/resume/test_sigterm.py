"""SIGTERM, as a scheduler preempting a job sends it: the fit saves last.ckpt at the step's end (whole before
the process exits) and says the command that resumes the run, and that command goes on in the one run
folder. The runs of test_background.py and tests/test_run_folders.py, with this extra back
on after their CORE_ONLY."""

import shlex
import signal
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import src.extras.resume.test_background as checkpoint_io
import tests.test_run_folders as run_folders
from src.checkpoints import load_checkpoint
from src.cli import main
from tests.conftest import QUIET

#: the core's runs with this extra's section as configs/defaults.yaml gives it
FIT_WITH_RESUME = [word for word in checkpoint_io.FIT if word != "--resume=null"]
SPIRAL_WITH_RESUME = [word for word in run_folders.SPIRAL if word != "--resume=null"]
FIRST_IS_BEST = run_folders.FIRST_IS_BEST


def test_sigterms_checkpoint_is_whole_before_the_process_exits(workdir: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([
            "fit", *FIT_WITH_RESUME, "--trainer.max_epochs=3", "--trainer.callbacks+=tests.helpers.SigtermAt",
            "--trainer.callbacks.step=3",
        ])  # fmt: skip
    assert exit_.value.code == 128 + signal.SIGTERM
    (last,) = workdir.rglob("last.ckpt")
    assert load_checkpoint(last)["global_step"] == 4  # the step under way finished, then its save


def test_the_advice_after_sigterm_is_a_command_that_resumes_the_run(workdir: Path, caplog) -> None:
    typed = ["fit", *SPIRAL_WITH_RESUME, "--trainer.max_epochs=3", *QUIET]
    stop = ["--trainer.callbacks+=tests.helpers.SigtermAt", "--trainer.callbacks.step=3"]
    with pytest.raises(SystemExit) as exit_:
        main([*typed, *stop])
    assert exit_.value.code == 128 + signal.SIGTERM
    advice = next(r.getMessage() for r in caplog.records if "Resume with: " in r.getMessage())
    words = shlex.split(advice.split("Resume with: ", 1)[1])
    assert words[:3] == ["python", "-m", "src.cli"]
    saved = Path(words[-1])
    run = saved.parent.parent
    resumed = main(words[3:])  # exactly as printed (the planted SIGTERM is behind this step already)
    assert Path(resumed.trainer.log_dir).resolve() == run.resolve()  # the same run, not a new version
    assert sorted(p.name for p in run.parent.iterdir()) == [run.name]
    whole = main([*typed, "--trainer.logger.init_args.name=whole"])
    assert resumed.trainer.global_step == whole.trainer.global_step
    for (name, a), b in zip(
        resumed.model.state_dict().items(), whole.model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(
    "logger", [[], ["--trainer.logger.init_args.name=exp"]], ids=["configured", "run-name-typed"]
)
def test_the_printed_resume_command_goes_on_in_the_one_run_folder(
    workdir: Path, caplog: pytest.LogCaptureFixture, logger: list[str]
) -> None:
    """A fit without a named version, stopped by SIGTERM after its first best checkpoint, and resumed
    with the command it printed: one run folder holds every checkpoint and every TensorBoard event file,
    and the best checkpoint of before the stop is still the best one (the epochs after it are worse)."""
    typed = ["fit", *SPIRAL_WITH_RESUME, *logger, "--trainer.max_epochs=4", *FIRST_IS_BEST, *QUIET]
    stop = ["--trainer.callbacks+=tests.helpers.SigtermAt", "--trainer.callbacks.step=3"]
    with pytest.raises(SystemExit):
        main([*typed, *stop])
    first = len(list(workdir.rglob("events.out.tfevents.*")))  # the stopped process's writers
    advice = next(r.getMessage() for r in caplog.records if "Resume with: " in r.getMessage())
    words = shlex.split(advice.split("Resume with: ", 1)[1])
    run = Path(words[-1]).parent.parent
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    resumed = main(words[3:])
    assert resumed.trainer.global_step == 8
    assert Path(resumed.trainer.log_dir).resolve() == run.resolve()
    assert [p.name for p in run.parent.iterdir()] == [run.name]
    events = list(workdir.rglob("events.out.tfevents.*"))
    # each process's writers (the run's, and under the dashboard's logger its train and validation stages')
    assert len(events) > first > 0
    assert all(run.resolve() in event.resolve().parents for event in events)
    tracked = resumed.trainer.checkpoint_callback
    assert isinstance(tracked, ModelCheckpoint)
    assert Path(tracked.best_model_path).resolve() == best.resolve()
    assert sorted((run / "checkpoints").glob("best-*.ckpt")) == [best]
