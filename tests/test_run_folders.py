"""A run folder is the user's record: no fit writes over another run's checkpoints, no resume deletes or
replaces a checkpoint it did not write, two fits never share a folder, settings typed beside
``--ckpt_path`` take effect or are refused in one sentence, and the advice after a stop works as printed."""

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from src.cli import CLI, main
from tests.conftest import CONFIGS, CORE_ONLY, ONE_PASS, QUIET

SPIRAL = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=300", *ONE_PASS,
    "--trainer.limit_val_batches=1", *CORE_ONLY,
]  # fmt: skip
#: the best checkpoint is the first validation's (the lowest step), so the run's last.ckpt gets further
FIRST_IS_BEST = ["--best_checkpoint.init_args.monitor=step", "--best_checkpoint.init_args.mode=min"]


def fit(*words: str) -> CLI:
    return main(["fit", *SPIRAL, *words, *QUIET])


def refused(capsys: pytest.CaptureFixture[str], run: Callable[[], object]) -> str:
    """The one sentence a refused command printed (exit status 2)."""
    with pytest.raises(SystemExit) as exit_:
        run()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0]


def contents(folder: Path) -> dict[str, bytes]:
    """Every file of a folder, by its path inside it."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_fit_never_writes_over_a_run_that_holds_checkpoints(workdir: Path, capsys) -> None:
    first = fit("--trainer.max_epochs=2", "--trainer.logger.init_args.version=r1")
    run = Path(first.trainer.log_dir)
    before = contents(run)
    assert "checkpoints/last.ckpt" in before
    assert "config.yaml" in before
    # the resume command with --ckpt_path forgotten
    sentence = refused(capsys, lambda: fit("--trainer.max_epochs=3", "--trainer.logger.init_args.version=r1"))
    assert str(run) in sentence
    assert "--ckpt_path" in sentence
    assert "--overwrite true" in sentence
    assert contents(run) == before
    # told to, it writes over it
    again = fit("--trainer.max_epochs=1", "--trainer.logger.init_args.version=r1", "--overwrite=true")
    assert again.trainer.state.finished
    assert Path(again.trainer.log_dir) == run


@pytest.mark.slow
def test_resuming_from_an_earlier_checkpoint_leaves_the_run_as_it_was(workdir: Path, capsys) -> None:
    first = fit("--trainer.max_epochs=3", "--trainer.logger.init_args.version=r1", *FIRST_IS_BEST)
    run = Path(first.trainer.log_dir)
    best = Path(first.trainer.checkpoint_callback.best_model_path)
    assert torch.load(best, weights_only=True)["global_step"] < first.trainer.global_step
    before = contents(run)
    # into the same named version: it would replace last.ckpt, which got further
    sentence = refused(
        capsys,
        lambda: fit("--trainer.max_epochs=4", "--trainer.logger.init_args.version=r1", f"--ckpt_path={best}"),
    )
    assert str(best) in sentence
    assert "last.ckpt" in sentence
    assert contents(run) == before
    # with no version named, the resumed fit writes a new one, and the run keeps every file
    resumed = fit("--trainer.max_epochs=4", f"--ckpt_path={best}", *FIRST_IS_BEST)
    assert resumed.trainer.state.finished
    assert Path(resumed.trainer.log_dir).parent == run.parent
    assert Path(resumed.trainer.log_dir) != run
    assert contents(run) == before


def test_resuming_from_the_newest_checkpoint_continues_in_the_run_and_deletes_none_of_its_files(
    workdir: Path,
) -> None:
    every_epoch_is_best = ["--best_checkpoint.init_args.monitor=step", "--best_checkpoint.init_args.mode=max"]
    first = fit("--trainer.max_epochs=2", *every_epoch_is_best)
    run = Path(first.trainer.log_dir)
    last = run / "checkpoints" / "last.ckpt"
    kept = {p.name: p.read_bytes() for p in (run / "checkpoints").glob("best-*.ckpt")}
    assert len(kept) == 1
    # each resumed epoch is a new best, which would displace the best file of the earlier process
    resumed = fit("--trainer.max_epochs=4", f"--ckpt_path={last}", *every_epoch_is_best)
    assert Path(resumed.trainer.log_dir).resolve() == run.resolve()  # the same run, no new version
    assert sorted(p.name for p in run.parent.iterdir()) == [run.name]
    assert resumed.trainer.global_step == 2 * first.trainer.global_step
    # the earlier process's best checkpoint is still there, whole, beside the new best
    for name, data in kept.items():
        assert (run / "checkpoints" / name).read_bytes() == data
    assert Path(resumed.trainer.checkpoint_callback.best_model_path).name not in kept


def test_two_fits_never_share_a_run_folder(workdir: Path, capsys) -> None:
    folder = workdir / "logs" / "spiral" / "r1"
    folder.mkdir(parents=True)
    holder = subprocess.Popen(  # another process, holding the run folder's lock while it lives
        [sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        sentence = refused(
            capsys, lambda: fit("--trainer.max_epochs=1", "--trainer.logger.init_args.version=r1")
        )
        assert "another process is writing into logs/spiral/r1" in sentence
        assert not list(folder.rglob("*"))
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # once it is gone, the folder is free
    assert fit("--trainer.max_epochs=1", "--trainer.logger.init_args.version=r1").trainer.state.finished


HOLD = """
import fcntl, os, sys, time
descriptor = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(descriptor, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


def test_ckpt_path_last_without_a_named_run_asks_for_one_and_names_no_other_runs_checkpoint(
    workdir: Path, capsys
) -> None:
    first = fit("--trainer.max_epochs=1")
    last = Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt"
    sentence = refused(capsys, lambda: fit("--trainer.max_epochs=2", "--ckpt_path=last"))
    assert "trainer.logger.init_args.version" in sentence
    assert ".ckpt" not in sentence  # another run's checkpoint is never the one to go on from
    # nothing was started: no new version folder
    assert sorted(p.name for p in last.parent.parent.parent.iterdir()) == ["version_0"]


def test_ckpt_path_last_into_a_named_version_with_nothing_to_resume_starts_fresh_and_says_so(
    workdir: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A requeued job passes ``--ckpt_path last`` on every start: the first starts fresh, in one line (no
    warning of Lightning's, which the test suite turns into an error), and the next resumes its last.ckpt."""
    job = ["--trainer.logger.init_args.version=same_fs", "--ckpt_path=last"]
    with caplog.at_level(logging.INFO):
        first = fit("--trainer.max_epochs=1", *job)
    run = Path("logs/spiral/same_fs")
    assert Path(first.trainer.log_dir) == run
    said = [r.getMessage() for r in caplog.records if "--ckpt_path last" in r.getMessage()]
    assert said == [
        f"--ckpt_path last finds no last.ckpt in {run / 'checkpoints'}: this fit starts afresh there, and "
        "the same command resumes from the checkpoints it writes."
    ]
    second = fit("--trainer.max_epochs=2", *job)
    assert Path(second.trainer.log_dir) == run
    assert second.trainer.global_step == 2 * first.trainer.global_step
    # a named version whose checkpoints none of them holds a fit's whole state has nothing to go on from
    held = Path("logs/spiral/other/checkpoints")
    held.mkdir(parents=True)
    (held / "best.ckpt").write_bytes(b"")
    sentence = refused(capsys, lambda: fit("--trainer.logger.init_args.version=other", "--ckpt_path=last"))
    assert sentence.startswith(f"error: --ckpt_path last finds no last.ckpt in {held}, and none of its ")


class FailAt(Callback):
    """Raises as optimizer step ``step`` starts (after last.ckpt's own hook: inside the step, which saves
    nothing): the fit ends there, leaving what a kill leaves."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError("killed")


def test_ckpt_path_last_without_a_last_ckpt_goes_on_from_the_runs_newest_checkpoint(
    workdir: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A run killed before its first last.ckpt (written at most once a minute) leaves its best checkpoints:
    the same command with ``--ckpt_path last`` goes on from the newest of them, by optimizer step, saying
    so in one line, to the state the uninterrupted run ends with; another run's newer last.ckpt beside it
    plays no part."""
    every_epoch_best = [
        "--trainer.max_epochs=3", "--best_checkpoint.init_args.monitor=step",
        "--best_checkpoint.init_args.mode=max", "--best_checkpoint.init_args.save_top_k=-1",
    ]  # fmt: skip
    uninterrupted = fit(*every_epoch_best, "--trainer.logger.init_args.version=U")
    steps = uninterrupted.trainer.global_step // 3  # one epoch's
    killed = main([*SPIRAL, *every_epoch_best, "--trainer.logger.init_args.version=K1", *QUIET], run=False)
    killed.trainer.callbacks.append(FailAt(2 * steps + 1))
    with pytest.raises(RuntimeError, match="killed"):
        killed.trainer.fit(killed.model, datamodule=killed.datamodule)
    run = Path("logs/spiral/K1/checkpoints")
    assert not (run / "last.ckpt").exists()  # the fit ended inside a step, before its first last.ckpt
    # the command without --ckpt_path is refused, naming the way to go on that works there
    sentence = refused(capsys, lambda: fit(*every_epoch_best, "--trainer.logger.init_args.version=K1"))
    assert "resume it with --ckpt_path last, " in sentence
    with caplog.at_level(logging.INFO):
        resumed = fit(*every_epoch_best, "--trainer.logger.init_args.version=K1", "--ckpt_path=last")
    (newest,) = run.glob(f"best-epoch001-step{2 * steps}.ckpt")
    said = [r.getMessage() for r in caplog.records if "--ckpt_path last" in r.getMessage()]
    assert said == [
        f"--ckpt_path last finds no last.ckpt in {run}: this fit goes on from its newest checkpoint, "
        f"{newest.name} (step {2 * steps})."
    ]
    assert Path(resumed.trainer.ckpt_path).resolve() == newest.resolve()  # the file said and checked
    assert resumed.trainer.global_step == uninterrupted.trainer.global_step == 3 * steps
    assert Path(resumed.trainer.log_dir) == run.parent
    torch.testing.assert_close(resumed.model.state_dict(), uninterrupted.model.state_dict(), rtol=0, atol=0)
    torch.testing.assert_close(
        resumed.trainer.optimizers[0].state_dict(), uninterrupted.trainer.optimizers[0].state_dict(), rtol=0,
        atol=0,
    )  # fmt: skip


def test_settings_typed_beside_ckpt_path_take_effect_or_are_refused(workdir: Path, capsys) -> None:
    first = fit("--trainer.max_epochs=1")
    last = str(Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt")
    plain = main(["validate", f"--ckpt_path={last}", *QUIET])
    halved = main(["validate", f"--ckpt_path={last}", "--data.batch_size=32", *QUIET])
    assert halved.datamodule.hparams["batch_size"] == 32
    assert halved.trainer.val_dataloaders.batch_size < plain.trainer.val_dataloaders.batch_size
    # the checkpoint's own settings fill in what was not typed: its net, not the default one
    assert type(halved.model.net) is type(first.model.net)
    assert halved.model.hparams["net"] == first.model.hparams["net"]
    # LightningCLI builds the model from the checkpoint's hyperparameters: a model setting it would drop
    # is refused, not ignored
    sentence = refused(
        capsys, lambda: main(["validate", f"--ckpt_path={last}", "--model.init_args.label_smoothing=0.5"])
    )
    assert sentence == (
        f"error: model.init_args.label_smoothing=0.5 differs from 0.0, which --ckpt_path {last} was trained "
        "with; LightningCLI builds a checkpoint's model from the hyperparameters it carries, so leave the "
        "setting out, or fit a new model with it."
    )
    # given as it was, it is no change
    assert main(["validate", f"--ckpt_path={last}", "--model.init_args.label_smoothing=0.0", *QUIET])


def test_a_resume_runs_and_records_the_seed_its_run_was_trained_with(workdir: Path, capsys) -> None:
    first = fit("--trainer.max_epochs=1", "--seed_everything=7")
    run = Path(first.trainer.log_dir)
    last = run / "checkpoints" / "last.ckpt"
    before = contents(run)
    # another seed would be recorded in the run, while the resume goes on from the run's random state
    sentence = refused(
        capsys, lambda: fit("--trainer.max_epochs=2", f"--ckpt_path={last}", "--seed_everything=8")
    )
    assert sentence == (
        f"error: seed_everything=8 differs from 7, which --ckpt_path {last} was trained with; a resumed fit "
        "continues that run, seeded as it was, so leave seed_everything out to resume, or start a new fit to "
        "train with another seed."
    )
    assert contents(run) == before
    # the seed left out (the checkpoint's), or typed as it was: the run goes on and records the seed it used
    for words in ([], ["--seed_everything=7"]):
        resumed = fit(f"--trainer.max_epochs={2 + len(words)}", f"--ckpt_path={last}", *words)
        assert Path(resumed.trainer.log_dir).resolve() == run.resolve()
        assert yaml.safe_load((run / "config.yaml").read_text())["seed_everything"] == 7
        assert torch.load(last, weights_only=True)["config"]["seed_everything"] == 7


def test_settings_the_checkpoint_cannot_take_are_refused(workdir: Path, capsys) -> None:
    first = fit("--trainer.max_epochs=1")
    last = str(Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt")
    shape = refused(
        capsys,
        lambda: fit(
            "--trainer.max_epochs=2",
            f"--ckpt_path={last}",
            "--model.init_args.net.init_args.hidden_sizes=[8]",
        ),
    )
    assert "model.init_args.net.init_args.hidden_sizes=[8] differs from" in shape
    rate = refused(
        capsys,
        lambda: fit(
            "--trainer.max_epochs=2", f"--ckpt_path={last}", "--model.init_args.optimizer.init_args.lr=0.5"
        ),
    )
    assert "model.init_args.optimizer.init_args.lr=0.5 differs" in rate
    assert "a resumed fit restores its optimizer and schedule as saved" in rate
    # evaluations take the same settings freely: they restore no optimizer
    assert main(["validate", f"--ckpt_path={last}", "--model.init_args.optimizer.init_args.lr=0.5", *QUIET])
