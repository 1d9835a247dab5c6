"""Resumed equals uninterrupted, bit for bit: at an epoch's end and in mid-epoch, dropout and shuffle on."""

import random
import signal
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from src.cli import CLI, main
from src.data.loading import ResumableLoader, check_batching
from src.errors import UserInputError
from src.extras.resume import Resume
from tests.conftest import BARE, CONFIGS, ONE_PASS, QUIET
from tests.helpers import SigtermAt, StopAt

# these tests also need the extras below; without one of them they are skipped
bundled_text = pytest.importorskip("src.extras.text").bundled_text

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_without_the_random_state_the_resumed_run_would_differ(workdir: Path) -> None:
    """The proof above is not vacuous: dropout draws from the generators that Resume restores."""
    uninterrupted = fitted(build())
    first = build()
    first.trainer.callbacks.append(StopAt(2 * BATCHES))
    fitted(first)
    resumed = build()
    resumed.trainer.callbacks = [c for c in resumed.trainer.callbacks if not isinstance(c, Resume)]
    with pytest.warns(UserWarning, match=r"Please add the following callbacks: \['RandomState'\]"):
        fitted(resumed, str(Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt"))
    weights = zip(resumed.model.parameters(), uninterrupted.model.parameters(), strict=True)
    assert any(not torch.equal(a, b) for a, b in weights)


def test_sigterm_saves_a_checkpoint_that_resumes_exactly(workdir: Path, caplog) -> None:
    uninterrupted = fitted(build())
    first = build()
    first.trainer.callbacks.append(SigtermAt(BATCHES + 2))  # in the middle of epoch 1
    with pytest.raises(SIGTERMException):
        fitted(first)
    saved = next(c for c in first.trainer.callbacks if isinstance(c, Resume)).saved
    assert saved == Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt"
    assert torch.load(saved, weights_only=True)["global_step"] == BATCHES + 3  # the step under way finished
    assert f"Stopped by SIGTERM after step {BATCHES + 3}; saved {saved}." in caplog.text
    assert_same_training(fitted(build(), str(saved)), uninterrupted)


def test_the_cli_exits_with_143_after_sigterm(cli, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli("fit", *ARGS, "--trainer.callbacks+=tests.helpers.SigtermAt", "--trainer.callbacks.step=3")
    assert exit_.value.code == 128 + signal.SIGTERM
    assert "Traceback" not in capsys.readouterr().err


def test_sigterm_writes_no_checkpoint_when_checkpointing_is_off(cli, workdir: Path, caplog) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli(
            "fit", *ARGS, "--trainer.enable_checkpointing=false",
            "--trainer.callbacks+=tests.helpers.SigtermAt", "--trainer.callbacks.step=3",
        )  # fmt: skip
    assert exit_.value.code == 128 + signal.SIGTERM
    assert list(workdir.rglob("*.ckpt")) == []
    assert (
        "Stopped by SIGTERM after step 4; nothing was saved, since trainer.enable_checkpointing is"
        in caplog.text
    )


@pytest.mark.slow
@pytest.mark.parametrize("plugins", [[], ["--trainer.plugins=null"]], ids=["shipped-io", "lightnings-io"])
def test_every_checkpoint_read_from_fit_to_predict_is_data_only(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, caplog, plugins: list[str]
) -> None:
    """fit, stopped by SIGTERM (which saves) → resumed → test → predict: every ``torch.load`` of a
    checkpoint, by the project or by Lightning, with the shipped checkpoint plugin or Lightning's own,
    asks for tensors and plain data only; and no save leaves it to Lightning to choose what it holds."""
    asked: list[object] = []
    load = torch.load

    def spy(*args: object, **kwargs: object) -> object:
        asked.append(kwargs.get("weights_only"))
        return load(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "load", spy)
    words = [*ARGS, "--trainer.max_epochs=1", *plugins, *QUIET]
    with pytest.raises(SystemExit):
        main(["fit", *words, "--trainer.callbacks+=tests.helpers.SigtermAt", "--trainer.callbacks.step=3"])
    (last,) = workdir.rglob("last.ckpt")
    assert torch.load(last, weights_only=True)["global_step"] == 4  # saved on SIGTERM
    resumed = main(["fit", *words, "--ckpt_path", str(last)])
    assert resumed.trainer.global_step == BATCHES
    main(["test", "--ckpt_path", str(last), *plugins, *QUIET])
    main(["predict", "--ckpt_path", str(last), *plugins, *QUIET, "--output", str(workdir / "out.csv")])
    assert (workdir / "out.csv").is_file()
    assert len(asked) >= 7  # the CLI's reads, Lightning's restores of fit, test and predict, ours above
    assert asked == [True] * len(asked)
    assert "`weights_only` was not set" not in caplog.text


# -- a mid-epoch resume under other batching: refused in one sentence, for every kind of data -----------


def kind_words(kind: str, folder: Path) -> tuple[list[str], str, int]:
    """A short fit of each shipped DataModule kind that a SIGTERM can stop in the middle of epoch 1: its
    words, the key of its batch size and that size. (The data is written into ``folder``.)"""
    from src.extras.images.test_images import tiny as tiny_images  # test_images imports this module
    from src.extras.images.test_images import write_images
    from src.extras.streaming.test_streaming import config as streaming_config
    from src.extras.streaming.test_streaming import frame_of, write_folder
    from src.extras.text.test_text import tiny as tiny_text

    resumable = ["--resume=src.extras.resume.Resume"]
    if kind == "tables":
        return [*ARGS, *QUIET], "--data.batch_size", 128
    if kind == "tables-repeated":  # the shipped data.min_batches_per_epoch: two passes an epoch
        return [*(w for w in ARGS if w not in ONE_PASS), *QUIET], "--data.batch_size", 128
    if kind == "images":
        return [*tiny_images(write_images(folder / "images")), *resumable], "--data.init_args.batch_size", 16
    if kind == "text":
        text = folder / "text.txt"
        text.write_text(bundled_text()[:12_000], encoding="utf-8")
        words = [*tiny_text(text), *BARE, *resumable, "--trainer.limit_train_batches=6", *QUIET]
        return words, "--data.init_args.batch_size", 32
    streamed = streaming_config(write_folder(folder / "rows", frame_of()), shuffle_row_groups=2)
    return ["--config", streamed, *QUIET], "--data.init_args.batch_size", 32


def stopped_in_epoch_1(words: list[str], step: int) -> Path:
    """Runs ``fit`` until SIGTERM arrives during optimizer step ``step``; the checkpoint it left."""
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "fit",
                *words,
                "--trainer.callbacks+=tests.helpers.SigtermAt",
                f"--trainer.callbacks.step={step}",
            ]
        )
    assert exit_.value.code == 128 + signal.SIGTERM
    (last,) = Path.cwd().rglob("last.ckpt")
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["epoch"] == 1  # in the middle of epoch 1
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["done"] > 0
    return last


def run_files(last: Path) -> dict[str, int]:
    """Each file of the run folder holding ``last``: its time of last change."""
    run = last.parent.parent
    return {str(path.relative_to(run)): path.stat().st_mtime_ns for path in run.rglob("*") if path.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "batches", "other"),
    [
        ("tables", BATCHES, 64),
        ("tables", BATCHES, 512),
        ("tables-repeated", 17, 64),
        ("images", 4, 8),
        ("text", 6, 16),  # 6: trainer.limit_train_batches
        ("streaming", 13, 64),
    ],
    ids=["tables-smaller", "tables-larger", "tables-repeated", "images", "text", "streaming"],
)
def test_a_mid_epoch_resume_with_another_batch_size_is_one_sentence(
    workdir: Path, capsys: pytest.CaptureFixture[str], kind: str, batches: int, other: int
) -> None:
    """A batch size that would cut the rest of the interrupted epoch otherwise (of ``batches``): the
    resume is refused before any step, in one sentence saying why and what to type, and the checkpoint
    stays as it was."""
    words, key, size = kind_words(kind, workdir)
    last = stopped_in_epoch_1(words, batches + 2)
    before, written = last.read_bytes(), run_files(last)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *words, f"{key}={other}", "--ckpt_path", str(last)])
    assert exit_.value.code == 2
    assert run_files(last) == written  # refused before the fit wrote config.yaml or an event file
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        f"error: this checkpoint stopped in the middle of an epoch, whose remaining batches cannot go on "
        f"exactly under other batching (data.batch_size={other} where the interrupted run had {size}); "
        f"resume with data.batch_size={size}, or resume from a checkpoint written at an epoch's end to "
        "change it.\n"
    ) in err
    assert last.read_bytes() == before


def test_a_mid_epoch_resume_with_another_drop_last_is_one_sentence(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    last = stopped_in_epoch_1([*ARGS, *QUIET], BATCHES + 2)
    written = run_files(last)
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *ARGS, *QUIET, "--data.drop_last=true", "--ckpt_path", str(last)])
    assert exit_.value.code == 2
    assert run_files(last) == written  # refused before the fit wrote config.yaml or an event file
    assert "(data.drop_last=true where the interrupted run had false); resume with data.drop_last=false" in (
        capsys.readouterr().err
    )


def test_a_mid_epoch_resume_on_rows_edited_since_is_one_sentence(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rows drawn anew with other noise: the same count, so the same batching, but rows held out for
    validation and test would move into training."""
    last = stopped_in_epoch_1([*ARGS, *QUIET], BATCHES + 2)
    before = last.read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *ARGS, "--data.noise=0.3", *QUIET, "--ckpt_path", str(last)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        "error: the checkpoint's run split other rows into training, validation and test (1500 rows edited)"
        in err
    )
    assert last.read_bytes() == before


def test_a_checkpoint_that_did_not_record_its_batching_is_refused_only_past_the_epochs_end() -> None:
    """Checkpoints written before the batching was saved: a position inside the new epoch cannot be
    told from a good one, a position past its end can."""
    now = {"batch_size": 512, "drop_last": False, "processes": 1, "items": 1050, "passes": 1}
    check_batching(None, now, done=2, batches=3)
    with pytest.raises(
        UserInputError, match=r"\(4 batches done of an epoch that now has 3\); resume with its "
    ):
        check_batching(None, now, done=4, batches=3)
    check_batching(now, now, done=2, batches=3)
    with pytest.raises(
        UserInputError, match=r"\(2 processes where the interrupted run had 1; a training split"
    ):
        check_batching(now, {**now, "processes": 2, "items": 1100}, done=2, batches=3)


def test_more_passes_an_epoch_are_named_unless_another_batch_size_made_them() -> None:
    """data.min_batches_per_epoch repeats the rows of a small split: a batch size changed on its own changes
    the passes too, and the sentence names the batch size only."""
    saved = {"batch_size": 128, "drop_last": False, "processes": 1, "items": 1050, "passes": 2}
    with pytest.raises(
        UserInputError, match=r"\(1 pass over the training items an epoch where the interrupted"
    ):
        check_batching(saved, {**saved, "passes": 1}, done=2, batches=9)
    with pytest.raises(
        UserInputError, match=r"\(data.batch_size=64 where the interrupted run had 128\); res"
    ):
        check_batching(saved, {**saved, "batch_size": 64, "passes": 1}, done=2, batches=17)


def test_ddp_resumed_in_the_middle_of_an_epoch_equals_uninterrupted_and_one_process_is_refused(
    workdir: Path,
) -> None:
    """Two processes, each its DistributedSampler's share: stopped 3 steps into epoch 1 and resumed on
    two, the replicas end bit for bit where the uninterrupted run's do; resumed on one process, whose
    batches would hold other rows, the run is refused."""
    from tests.test_distributed import TRAINER, B, RankReport
    from tests.test_distributed import build as build_spiral

    step = 7 + 3  # 210 training rows in 2 x 15 a step: 7 steps an epoch

    def fit(report: Path, *callbacks: Callback, ckpt_path: str | None = None, ddp: bool = True) -> None:
        parallel = ["--config", str(TRAINER / "ddp.yaml"), "--trainer.strategy=ddp_fork"] if ddp else []
        run = build_spiral(
            *parallel, f"--data.batch_size={B}", "--model.init_args.net.init_args.dropout=0.2",
            "--trainer.max_epochs=3",
        )  # fmt: skip
        report.mkdir()
        saver = ModelCheckpoint(report / "checkpoints", "mid", every_n_train_steps=step)
        run.trainer.callbacks.extend([RankReport(report), saver, Resume(), *callbacks])
        run.trainer.fit(run.model, datamodule=run.datamodule, ckpt_path=ckpt_path)

    fit(workdir / "uninterrupted")
    fit(workdir / "first", StopAt(step))
    middle = workdir / "first" / "checkpoints" / "mid.ckpt"
    checkpoint = torch.load(middle, weights_only=True)
    assert (checkpoint["global_step"], checkpoint["epoch"]) == (step, 1)
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["done"] == 3
    fit(workdir / "resumed", ckpt_path=str(middle))
    for rank in range(2):
        resumed = torch.load(workdir / "resumed" / f"rank{rank}.pt", weights_only=True)
        uninterrupted = torch.load(workdir / "uninterrupted" / f"rank{rank}.pt", weights_only=True)
        assert resumed["global_step"] == uninterrupted["global_step"] == 21
        torch.testing.assert_close(resumed["weights"], uninterrupted["weights"], rtol=0, atol=0)
    with pytest.raises(
        UserInputError, match=r"\(1 process where the interrupted run had 2\); resume on 2 proc"
    ):
        fit(workdir / "alone", ckpt_path=str(middle), ddp=False)


@pytest.mark.parametrize("form", ["tensor", "list"])
def test_the_python_generator_goes_on_from_its_saved_words(form: str) -> None:
    """Saved as one tensor of its 625 numbers (cheap to copy at every save); older checkpoints: a list."""
    random.seed(5)
    callback = Resume(preemption=False)  # the generators alone: no trainer to read
    state = callback.state_dict()
    expected = [random.random() for _ in range(3)]
    version, words, gauss = state["python"]
    assert isinstance(words, torch.Tensor)
    assert words.dtype == torch.int64
    if form == "list":
        state["python"] = [version, words.tolist(), gauss]
    random.seed(99)
    callback.load_state_dict(state)
    callback.on_train_start(None, None)  # type: ignore[arg-type]  # reads nothing of them
    assert [random.random() for _ in range(3)] == expected
