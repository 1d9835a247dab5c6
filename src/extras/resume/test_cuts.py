"""A stop at any moment resumes bit for bit: SIGTERM at each point of an epoch where Lightning can stop
(a step, the last step, the closing validation, the epoch's end hooks, a checkpoint write, the sanity
check), the checkpoint a kill leaves after any step, and both at random moments on a busy machine. A
SIGTERM lets a validation under way finish, so that no epoch's score is lost across the stop."""

import contextlib
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from src.checkpoint_io import AtomicCheckpointIO
from src.cli import main
from src.extras.resume import Resume
from src.extras.resume.test_resume import ARGS, BATCHES, COSINE, EPOCHS, fitted
from src.extras.resume.test_resume import build as build_constant
from tests.conftest import QUIET

# A checkpoint written between an epoch's last step and its end (a best checkpoint written at the
# validation's end) resumes with that epoch's validation counted as run, as Lightning resumes its own step
# checkpoints: weights, optimizer and order go on exactly, the monitored value of that epoch is not logged
pytestmark = pytest.mark.filterwarnings("ignore:`ModelCheckpoint\\(monitor='val/loss'\\)` could not find")


def build(*extra: str) -> Any:
    """test_resume's run with the spiral config's own cosine schedule, as the shipped configs have: its
    length read from the Trainer builds the training loader before Lightning restores the loops, so
    that only the DataModule's copy of the loader's position puts a resumed loader where it stood."""
    return build_constant(*COSINE, *extra)


#: last.ckpt after every optimizer step, so that a kill at any moment leaves the newest step's state
EVERY_STEP = ["--last_checkpoint.init_args.every_n_train_steps=1"]
#: whether a hook's call (the Trainer, the hook's other arguments) is the moment to send a signal
Moment = Callable[[L.Trainer, tuple[Any, ...]], bool]


def weights_and_moments(run: Any) -> dict[str, torch.Tensor]:
    """The model's tensors and the optimizer's state, by name: what a resume must reproduce."""
    state = {f"model.{name}": value.clone() for name, value in run.model.state_dict().items()}
    for index, values in enumerate(run.trainer.optimizers[0].state.values()):
        state |= {f"optimizer.{index}.{key}": value.clone() for key, value in values.items()}
    return state


def assert_exact(resumed: Any, uninterrupted: dict[str, torch.Tensor]) -> None:
    assert resumed.trainer.global_step == EPOCHS * BATCHES
    got = weights_and_moments(resumed)
    assert got.keys() == uninterrupted.keys()
    for name, value in uninterrupted.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)


def uninterrupted_in(folder: Path, *extra: str) -> dict[str, torch.Tensor]:
    """The end of the uninterrupted fit, run in ``folder``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(sys, "argv", ["src.cli"])
        return weights_and_moments(fitted(build(*extra)))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    return uninterrupted_in(tmp_path_factory.mktemp("uninterrupted"))


class SigtermAtHook(Callback):
    """Sends this process SIGTERM once, from ``hook`` at the first call where ``moment`` holds."""

    def __init__(self, hook: str, moment: Moment) -> None:
        self.hook, self.moment, self.sent = hook, moment, False

    def _call(self, name: str, trainer: L.Trainer, args: tuple[Any, ...]) -> None:
        if not self.sent and name == self.hook and self.moment(trainer, args):
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)

    def on_sanity_check_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._call("on_sanity_check_start", trainer, args)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._call("on_train_batch_start", trainer, args)

    def on_validation_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._call("on_validation_batch_start", trainer, args)

    def on_train_epoch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._call("on_train_epoch_end", trainer, args)

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._call("on_train_epoch_start", trainer, args)

    def on_save_checkpoint(self, trainer: L.Trainer, *args: Any) -> None:
        self._call("on_save_checkpoint", trainer, args)


def validating_epoch_1(batch: int) -> Moment:
    # args: (pl_module, batch, batch_idx)
    return lambda trainer, args: (
        trainer.current_epoch == 1 and not trainer.sanity_checking and args[2] == batch
    )


#: where a SIGTERM lands, and the moment it is sent at. The validation at an epoch's end runs inside the
#: epoch (its last step is done, the epoch not yet ended): a SIGTERM during the last step or before the
#: last validation batch stops the run there
SIGTERM_POINTS: dict[str, tuple[str, Moment]] = {
    "a-step-in-mid-epoch": ("on_train_batch_start", lambda t, a: t.global_step == BATCHES + 2),
    "the-epochs-last-step": ("on_train_batch_start", lambda t, a: t.global_step == 2 * BATCHES - 1),
    "its-validation": ("on_validation_batch_start", validating_epoch_1(0)),
    "its-last-validation-batch": ("on_validation_batch_start", validating_epoch_1(1)),
    "the-epochs-end-hooks": ("on_train_epoch_end", lambda t, a: t.current_epoch == 1),
    "the-epochs-checkpoint": ("on_save_checkpoint", lambda t, a: t.current_epoch == 1),
    "the-next-epochs-start": ("on_train_epoch_start", lambda t, a: t.current_epoch == 2),
    "the-sanity-check": ("on_validation_batch_start", lambda t, a: t.sanity_checking),
}
#: in make test: the closing validation, whose resume once drew the next epoch's order one epoch ahead
FAST = {"its-validation"}


def stopped_and_resumed(extra: list[str], *callbacks: Callback, run: Callable[..., Any] = build) -> Any:
    """A fit with ``callbacks`` stopped by SIGTERM, then resumed from what it saved (a fresh start where it
    saved nothing): the resumed run."""
    first = run(*extra)
    first.trainer.callbacks.extend(callbacks)
    with pytest.raises(SIGTERMException):
        fitted(first)
    saved = next(c for c in first.trainer.callbacks if isinstance(c, Resume)).saved
    return fitted(run(*extra), str(saved) if saved is not None else None)


@pytest.mark.parametrize(
    "point",
    [pytest.param(p, marks=() if p in FAST else pytest.mark.slow) for p in SIGTERM_POINTS],
)
def test_a_sigterm_at_each_point_of_an_epoch_resumes_exactly(
    workdir: Path, uninterrupted: dict[str, torch.Tensor], point: str
) -> None:
    hook, moment = SIGTERM_POINTS[point]
    assert_exact(stopped_and_resumed([], SigtermAtHook(hook, moment)), uninterrupted)


def test_a_sigterm_in_the_closing_validation_resumes_exactly_with_a_constant_learning_rate(
    workdir: Path,
) -> None:
    """Without a run-length schedule Lightning hands the loader its own copy of the position, which once
    was refused for all of the epoch's batches done (as if the batching had changed)."""
    uninterrupted = weights_and_moments(fitted(build_constant()))
    hook, moment = SIGTERM_POINTS["its-validation"]
    assert_exact(stopped_and_resumed([], SigtermAtHook(hook, moment), run=build_constant), uninterrupted)


def test_a_sigterm_in_the_sanity_check_stops_after_the_first_step(workdir: Path, caplog) -> None:
    """The signal is noted; the fit stops at the end of the first training batch, with its state saved."""
    first = build()
    first.trainer.callbacks.append(SigtermAtHook(*SIGTERM_POINTS["the-sanity-check"]))
    with pytest.raises(SIGTERMException):
        fitted(first)
    (last,) = workdir.rglob("*.ckpt")
    assert torch.load(last, weights_only=True)["global_step"] == 1
    assert f"Stopped by SIGTERM after step 1; saved {last.relative_to(workdir)}. Resume with:" in caplog.text


def test_a_ctrl_c_stops_at_the_steps_end_exits_130_and_resumes_exactly(
    workdir: Path, uninterrupted: dict[str, torch.Tensor], caplog: pytest.LogCaptureFixture
) -> None:
    """SIGINT, as Ctrl-C sends it, is noted like SIGTERM: the step under way ends, last.ckpt is saved once,
    the command says so and exits 130 (Lightning's own KeyboardInterrupt would exit 1), and the saved
    state goes on exactly."""
    step = BATCHES + 2  # in the middle of epoch 1
    words = [
        "--trainer.callbacks+=tests.helpers.SignalAt", f"--trainer.callbacks.step={step}",
        f"--trainer.callbacks.folder={workdir}", "--trainer.callbacks.name=SIGINT",
    ]  # fmt: skip
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *ARGS, *COSINE, *words, *QUIET])
    assert stopped.value.code == 128 + signal.SIGINT
    (last,) = workdir.rglob("last.ckpt")
    assert torch.load(last, weights_only=True)["global_step"] == step + 1
    assert caplog.text.count(f"Stopped by Ctrl-C (SIGINT) after step {step + 1}; saved ") == 1
    assert signal.getsignal(signal.SIGINT) is handler  # given back
    assert_exact(fitted(build(), str(last)), uninterrupted)


def heard_by_lightning() -> SigtermAtHook:
    """SIGTERM sent just before the fit's own handler takes over, where Lightning's hears it (callbacks
    run in their order: this one goes first)."""
    return SigtermAtHook("on_sanity_check_start", lambda trainer, args: True)


def test_a_sigterm_heard_before_the_first_step_saves_nothing_and_says_so(workdir: Path, caplog) -> None:
    """Lightning stops inside the sanity check, whose generators' state it undoes after: no checkpoint."""
    first = build()
    first.trainer.callbacks.insert(0, heard_by_lightning())
    with pytest.raises(SIGTERMException):
        fitted(first)
    assert list(workdir.rglob("*.ckpt")) == []
    assert (
        "Stopped by SIGTERM before the first training step; nothing was saved: start the run again with "
        "the same command." in caplog.text
    )


def resumed_after_a_sigterm_heard_by_lightning() -> Any:
    first = build()
    first.trainer.callbacks.insert(0, heard_by_lightning())
    with pytest.raises(SIGTERMException):
        fitted(first)
    saved = next(c for c in first.trainer.callbacks if isinstance(c, Resume)).saved
    return fitted(build(), str(saved) if saved is not None else None)


class CopyBestAt(Callback):
    """Copies the best checkpoint written in epoch ``epoch``'s closing validation (its last step done,
    the epoch not yet ended) once it is whole."""

    def __init__(self, epoch: int, to: Path) -> None:
        self.epoch, self.to = epoch, to

    def on_train_epoch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.current_epoch == self.epoch:
            trainer.strategy.checkpoint_io.wait()  # type: ignore[union-attr]  # BackgroundCheckpointIO
            (best,) = [c for c in trainer.checkpoint_callbacks if c.monitor is not None]
            assert f"epoch{self.epoch:03d}" in best.best_model_path  # written in this epoch's validation
            self.to.write_bytes(Path(best.best_model_path).read_bytes())


#: the best checkpoint written at the validation's end, inside the epoch (Lightning's own choice, with one
#: validation an epoch, is the epoch's end)
IN_VALIDATION = ["--best_checkpoint.init_args.save_on_train_epoch_end=false"]


def resumed_from_the_best_of_epoch_1(workdir: Path) -> Any:
    first = build(*IN_VALIDATION)
    first.trainer.callbacks.append(CopyBestAt(1, workdir / "best.ckpt"))
    fitted(first)
    return fitted(build(*IN_VALIDATION), str(workdir / "best.ckpt"))


def test_a_resume_from_a_checkpoint_written_in_the_closing_validation_is_exact(
    workdir: Path, uninterrupted: dict[str, torch.Tensor]
) -> None:
    """A best checkpoint written within the epoch's closing validation: a resume from it re-enters that
    epoch with all of its batches done, draws its order, and goes on exactly."""
    assert_exact(resumed_from_the_best_of_epoch_1(workdir), uninterrupted)


def tracked(run: Any) -> dict[str, Any]:
    """What the fit tracks from each epoch's validation: the best checkpoint's score and file, and early
    stopping's best and patience used."""
    (best,) = [c for c in run.trainer.checkpoint_callbacks if c.monitor is not None]
    stopping = run.trainer.early_stopping_callback
    return {
        "best score": best.best_model_score,
        "best file": Path(best.best_model_path).name,
        "stopping best": stopping.best_score,
        "epochs without improvement": stopping.wait_count,
    }


@pytest.mark.parametrize(
    "point", ["its-validation", pytest.param("its-last-validation-batch", marks=pytest.mark.slow)]
)
def test_a_sigterm_in_the_closing_validation_lets_it_finish_and_loses_no_epochs_score(
    workdir: Path, point: str
) -> None:
    """The validation under way when SIGTERM comes is run to its end and counted (the best checkpoint
    and early stopping see its score), and the fit stops at the next epoch's first step: the resumed
    run tracks the same best and patience as the uninterrupted one."""
    whole, before, after = Scores(), Scores(), Scores()
    with pytest.MonkeyPatch.context() as patch:
        (workdir / "whole").mkdir()
        patch.chdir(workdir / "whole")
        uninterrupted = build()
        uninterrupted.trainer.callbacks.append(whole)
        fitted(uninterrupted)
    hook, moment = SIGTERM_POINTS[point]
    first = build()
    first.trainer.callbacks.extend([SigtermAtHook(hook, moment), before])
    with pytest.raises(SIGTERMException):
        fitted(first)
    saved = next(c for c in first.trainer.callbacks if isinstance(c, Resume)).saved
    assert torch.load(saved, weights_only=True)["global_step"] == 2 * BATCHES + 1
    resumed = build()
    resumed.trainer.callbacks.append(after)
    fitted(resumed, str(saved))
    assert before.seen + after.seen == whole.seen  # every epoch's validation, each counted once
    assert [epoch for epoch, _ in whole.seen] == list(range(EPOCHS))
    assert tracked(resumed) == tracked(uninterrupted)


def test_a_sigterm_in_the_last_validation_stops_at_the_fits_end(
    workdir: Path, uninterrupted: dict[str, torch.Tensor], caplog: pytest.LogCaptureFixture
) -> None:
    """No training batch follows: the fit stops once it is over (before a test would start), saved."""
    first = build()
    last_epoch = lambda trainer, args: trainer.current_epoch == EPOCHS - 1 and not trainer.sanity_checking  # noqa: E731
    first.trainer.callbacks.append(SigtermAtHook("on_validation_batch_start", last_epoch))
    with pytest.raises(SIGTERMException):
        fitted(first)
    saved = next(c for c in first.trainer.callbacks if isinstance(c, Resume)).saved
    assert saved is not None
    assert torch.load(saved, weights_only=True)["global_step"] == EPOCHS * BATCHES
    assert f"Stopped by SIGTERM after step {EPOCHS * BATCHES}; saved " in caplog.text
    assert_exact(fitted(build(), str(saved)), uninterrupted)


class Scores(Callback):
    """Each validation that ran to its end: the epoch and its val/loss."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []

    def on_validation_end(self, trainer: L.Trainer, *args: Any) -> None:
        if not trainer.sanity_checking:
            self.seen.append((trainer.current_epoch, float(trainer.callback_metrics["val/loss"])))


class SigtermWhileWriting(AtomicCheckpointIO):
    """Writes checkpoints slowly; the write of the one after ``step`` optimizer steps gets SIGTERM sent in
    its middle, from the writer's thread, while the training thread goes on."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if checkpoint["global_step"] == self.step and Path(path).name == "last.ckpt":
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
        super().save_checkpoint(checkpoint, path, storage_options)


@pytest.mark.slow
@pytest.mark.parametrize("step", [BATCHES + 2, 2 * BATCHES - 1, 2 * BATCHES + 1])
def test_a_sigterm_during_a_background_checkpoint_write_resumes_exactly(
    workdir: Path, uninterrupted: dict[str, torch.Tensor], step: int
) -> None:
    plugin = {
        "class_path": "src.extras.resume.background.BackgroundCheckpointIO",
        "init_args": {
            "checkpoint_io": {"class_path": f"{__name__}.SigtermWhileWriting", "init_args": {"step": step}}
        },
    }
    resumed = stopped_and_resumed([*EVERY_STEP, f"--trainer.plugins=[{plugin}]"])
    assert_exact(resumed, uninterrupted)


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(BATCHES + 3, marks=pytest.mark.slow),
        2 * BATCHES,  # the epoch's last step, whose save waits: a kill in its closing validation
        pytest.param(2 * BATCHES + 1, marks=pytest.mark.slow),
    ],
)
def test_the_checkpoint_a_kill_leaves_after_any_step_resumes_exactly(
    workdir: Path, uninterrupted: dict[str, torch.Tensor], step: int
) -> None:
    """What a kill after ``step`` leaves: last.ckpt as written at that step's end (whole: atomic writes),
    or, after an epoch's last step, the step before's, so that the resume runs that epoch's validation."""
    first = build(*EVERY_STEP)
    first.trainer.callbacks.append(CopyLastAt(step, workdir / "killed.ckpt"))
    fitted(first)
    written = step - 1 if step % BATCHES == 0 else step
    assert torch.load(workdir / "killed.ckpt", weights_only=True)["global_step"] == written
    resumed, scores = build(*EVERY_STEP), Scores()
    resumed.trainer.callbacks.append(scores)
    assert_exact(fitted(resumed, str(workdir / "killed.ckpt")), uninterrupted)
    assert [epoch for epoch, _ in scores.seen] == list(range(written // BATCHES, EPOCHS))


class CopyLastAt(Callback):
    """Copies last.ckpt as it stands once the write of ``step``'s has ended (before the next step starts,
    or the epoch's validation): the file a kill at that moment would leave."""

    def __init__(self, step: int, to: Path) -> None:
        self.step, self.to = step, to

    def _copy(self, trainer: L.Trainer) -> None:
        if trainer.global_step == self.step and not self.to.exists():
            trainer.strategy.checkpoint_io.wait()  # type: ignore[union-attr]  # BackgroundCheckpointIO
            last = next(Path(trainer.log_dir).rglob("last.ckpt"))  # type: ignore[arg-type]
            self.to.write_bytes(last.read_bytes())

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._copy(trainer)

    def on_validation_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._copy(trainer)


# -- at random moments, on a busy machine -------------------------------------------------------------


@pytest.fixture
def busy() -> Iterator[None]:
    """Two processes spinning on the CPU for the test's length: a machine busy with other fits."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def random_moment(rng: random.Random) -> tuple[int, float]:
    """A step to arm at, mostly one of epoch 1's last or epoch 2's first (where the cuts lie close
    together), and a delay after it of up to two steps' time."""
    step = rng.choice([rng.randrange(1, EPOCHS * BATCHES), *range(2 * BATCHES - 2, 2 * BATCHES + 2)])
    return step, rng.uniform(0.0, 0.06)


class SignalAfter(Callback):
    """Arms a timer at the start of optimizer step ``step`` that sends ``signum`` to this process after
    ``delay`` seconds: a signal landing wherever the run is by then (a step, validation, a write)."""

    def __init__(self, step: int, delay: float, signum: int) -> None:
        self.step, self.delay, self.signum = step, delay, signum
        self.timer: threading.Timer | None = None

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step and self.timer is None:
            self.timer = threading.Timer(self.delay, os.kill, (os.getpid(), self.signum))
            self.timer.start()


@pytest.mark.slow
def test_sigterms_at_random_moments_on_a_busy_machine_resume_exactly(
    workdir: Path, uninterrupted: dict[str, torch.Tensor], busy: None
) -> None:
    rng = random.Random(20260101)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a signal landing after the fit: ignored
    try:
        for trial in range(24):
            folder = workdir / f"sigterm{trial}"
            folder.mkdir()
            os.chdir(folder)  # the workdir fixture goes back at the end
            step, delay = random_moment(rng)
            first = build(*EVERY_STEP)
            first.trainer.callbacks.append(SignalAfter(step, delay, signal.SIGTERM))
            with contextlib.suppress(SIGTERMException):  # none: the signal came after the fit's end
                fitted(first)
            saved = next(c for c in first.trainer.callbacks if isinstance(c, Resume)).saved
            resumed = fitted(build(*EVERY_STEP), str(saved) if saved is not None else None)
            assert_exact(resumed, uninterrupted)
    finally:
        signal.signal(signal.SIGTERM, previous)


def killed_child(folder: Path, step: int, delay: float) -> None:
    """A fit in ``folder`` that SIGKILLs itself ``delay`` seconds after optimizer step ``step`` starts."""
    os.chdir(folder)
    first = build(*EVERY_STEP)
    first.trainer.callbacks.append(SignalAfter(step, delay, signal.SIGKILL))
    fitted(first)


@pytest.mark.slow
def test_kills_at_random_moments_on_a_busy_machine_resume_exactly(
    workdir: Path, uninterrupted: dict[str, torch.Tensor], busy: None
) -> None:
    rng = random.Random(20260102)
    killed = 0
    for trial in range(12):
        folder = workdir / f"kill{trial}"
        folder.mkdir()
        step, delay = random_moment(rng)
        child = multiprocessing.get_context("fork").Process(target=killed_child, args=(folder, step, delay))
        child.start()
        child.join()
        assert child.exitcode in (0, -signal.SIGKILL)  # 0: the fit ended before the signal came
        killed += child.exitcode != 0
        os.chdir(folder)
        last = next(folder.rglob("last.ckpt"), None)  # none: killed before the first write ended
        assert_exact(fitted(build(*EVERY_STEP), str(last) if last else None), uninterrupted)
    assert killed >= 9
