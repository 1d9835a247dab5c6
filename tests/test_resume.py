"""Resumed equals uninterrupted, bit for bit: at an epoch's end and in mid-epoch, dropout and shuffle on."""

import os
import signal
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from src.callbacks import Preemption, RandomState
from src.cli import CLI, main
from src.data.datamodule import ResumableLoader
from tests.conftest import CONFIGS, ONE_PASS, QUIET

EPOCHS, BATCHES = 4, 9  # spiral: 1050 training rows in batches of 128
ARGS = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=1500", *ONE_PASS,
    f"--trainer.max_epochs={EPOCHS}",
    "--model.init_args.net.init_args.dropout=0.2", "--model.init_args.scheduler=null",
    "--trainer.limit_val_batches=2",
]  # fmt: skip
#: the spiral config's own cosine schedule, whose length the task reads from the Trainer while the
#: optimizers are configured (Trainer.estimated_stepping_batches builds the training loader early)
COSINE = ["--model.init_args.scheduler=src.models.schedules.Cosine"]


class StopAt(Callback):
    """Stops the fit after the given optimizer step, as a crash or a preemption would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


def build(*extra: str) -> CLI:
    return main([*ARGS, *extra, *QUIET], run=False)


def fitted(run: CLI, ckpt_path: str | None = None) -> CLI:
    run.trainer.fit(run.model, datamodule=run.datamodule, ckpt_path=ckpt_path)
    return run


def assert_same_training(resumed: CLI, uninterrupted: CLI) -> None:
    assert resumed.trainer.global_step == uninterrupted.trainer.global_step == EPOCHS * BATCHES
    for (name, a), b in zip(
        resumed.model.state_dict().items(), uninterrupted.model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    for a, b in zip(
        resumed.trainer.optimizers[0].state.values(),
        uninterrupted.trainer.optimizers[0].state.values(),
        strict=True,
    ):
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    for key in ("train/loss", "val/loss"):
        torch.testing.assert_close(
            resumed.trainer.callback_metrics[key], uninterrupted.trainer.callback_metrics[key], rtol=0, atol=0
        )


def test_resumed_at_an_epochs_end_equals_uninterrupted(workdir: Path) -> None:
    uninterrupted = fitted(build())
    first = build()
    first.trainer.callbacks.append(StopAt(2 * BATCHES))  # stops after epoch 1, as last.ckpt is written
    fitted(first)
    last = Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 2 * BATCHES
    assert_same_training(fitted(build(), str(last)), uninterrupted)


@pytest.mark.parametrize("schedule", [[], COSINE], ids=["constant-lr", "run-length-schedule"])
def test_resumed_in_the_middle_of_an_epoch_equals_uninterrupted(workdir: Path, schedule: list[str]) -> None:
    uninterrupted = fitted(build(*schedule))
    first = build(*schedule)
    step = BATCHES + 4  # after the fourth batch of epoch 1
    saver = ModelCheckpoint(dirpath=workdir / "mid", filename="mid", every_n_train_steps=step)
    first.trainer.callbacks.extend([StopAt(step), saver])
    fitted(first)
    middle = workdir / "mid" / "mid.ckpt"
    checkpoint = torch.load(middle, weights_only=True)
    assert (checkpoint["global_step"], checkpoint["epoch"]) == (step, 1)
    assert isinstance(first.trainer.train_dataloader, ResumableLoader)
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["done"] == 4
    resumed = build(*schedule)
    # the same callbacks as the run that wrote the checkpoint (Lightning restores each one's state)
    resumed.trainer.callbacks.append(
        ModelCheckpoint(dirpath=workdir / "again", filename="again", every_n_train_steps=step)
    )
    assert_same_training(fitted(resumed, str(middle)), uninterrupted)


def test_without_the_random_state_the_resumed_run_would_differ(workdir: Path) -> None:
    """The proof above is not vacuous: dropout draws from the generators that RandomState restores."""
    uninterrupted = fitted(build())
    first = build()
    first.trainer.callbacks.append(StopAt(2 * BATCHES))
    fitted(first)
    resumed = build()
    resumed.trainer.callbacks = [c for c in resumed.trainer.callbacks if not isinstance(c, RandomState)]
    with pytest.warns(UserWarning, match=r"Please add the following callbacks: \['RandomState'\]"):
        fitted(resumed, str(Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt"))
    weights = zip(resumed.model.parameters(), uninterrupted.model.parameters(), strict=True)
    assert any(not torch.equal(a, b) for a, b in weights)


class SigtermAt(Callback):
    """Sends this process SIGTERM during a training step, as a scheduler preempting the job would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_saves_a_checkpoint_that_resumes_exactly(workdir: Path, caplog) -> None:
    uninterrupted = fitted(build())
    first = build()
    first.trainer.callbacks.append(SigtermAt(BATCHES + 2))  # in the middle of epoch 1
    with pytest.raises(SIGTERMException):
        fitted(first)
    saved = next(c for c in first.trainer.callbacks if isinstance(c, Preemption)).saved
    assert saved == Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt"
    assert torch.load(saved, weights_only=True)["global_step"] == BATCHES + 3  # the step under way finished
    assert f"Stopped by SIGTERM after step {BATCHES + 3}; saved {saved}." in caplog.text
    assert_same_training(fitted(build(), str(saved)), uninterrupted)


def test_the_cli_exits_with_143_after_sigterm(cli, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli("fit", *ARGS, "--trainer.callbacks+=tests.test_resume.SigtermAt", "--trainer.callbacks.step=3")
    assert exit_.value.code == 128 + signal.SIGTERM
    assert "Traceback" not in capsys.readouterr().err


def test_sigterm_writes_no_checkpoint_when_checkpointing_is_off(cli, workdir: Path, caplog) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli(
            "fit", *ARGS, "--trainer.enable_checkpointing=false",
            "--trainer.callbacks+=tests.test_resume.SigtermAt", "--trainer.callbacks.step=3",
        )  # fmt: skip
    assert exit_.value.code == 128 + signal.SIGTERM
    assert list(workdir.rglob("*.ckpt")) == []
    assert (
        "Stopped by SIGTERM after step 4; nothing was saved, since trainer.enable_checkpointing is"
        in caplog.text
    )
