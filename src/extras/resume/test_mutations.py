"""Break a mid-epoch resume on purpose: the proof that resumed equals uninterrupted must fail."""

from pathlib import Path

import pytest

import src.extras.resume.test_cuts as cuts
import src.extras.resume.test_resume as resume
from src.data.loading import ResumableDataModule, ResumableLoader
from src.extras.resume import Resume
from tests.test_mutations import mutate

pytestmark = cuts.pytestmark  # the checks below run test_cuts' proofs, under its warning filter


def test_resume_catches_a_loader_that_forgets_the_batches_it_served(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the count a mid-epoch resume skips: without it the resumed epoch starts over from its first batch
    mutate(
        monkeypatch,
        ResumableDataModule,
        "on_before_batch_transfer",
        "self._train_loader.processed += 1",
        "pass",
    )
    with pytest.raises(AssertionError):
        resume.test_resumed_in_the_middle_of_an_epoch_equals_uninterrupted(workdir, [])


def test_resume_catches_a_datamodule_that_keeps_the_loaders_position_to_itself(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # with a run-length schedule Lightning builds the loader before it restores the loader's own state,
    # and never hands it over: only the DataModule's copy puts the resumed loader where it stood
    mutate(
        monkeypatch,
        ResumableDataModule,
        "train_dataloader",
        "loader.load_state_dict(self._loader_state)",
        "pass",
    )
    with pytest.raises(AssertionError):
        resume.test_resumed_in_the_middle_of_an_epoch_equals_uninterrupted(workdir, resume.COSINE)


def test_cuts_catch_a_loader_that_forgets_an_epoch_closing_its_validation(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a checkpoint written within the validation at an epoch's end, which Lightning resumes inside that
    # epoch: without its position the resume draws the epoch's order again, and the next epoch's is off
    mutate(monkeypatch, ResumableLoader, "position", " or self.closing()", "")
    with pytest.raises(AssertionError):
        cuts.assert_exact(cuts.resumed_from_the_best_of_epoch_1(workdir), cuts.uninterrupted_in(workdir))


def test_cuts_catch_a_loader_that_skips_the_batches_done_only_when_asked_for_one(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an epoch re-entered with all its batches done is never asked for a batch: skipped lazily, its order
    # is never drawn, and the next epoch draws the interrupted epoch's generator state again
    mutate(
        monkeypatch,
        ResumableLoader,
        "__iter__",
        "deque(batches, maxlen=0)",
        "batches = itertools.islice(batches, skip, None)",
    )
    with pytest.raises(AssertionError):
        cuts.assert_exact(cuts.resumed_from_the_best_of_epoch_1(workdir), cuts.uninterrupted_in(workdir))


def test_cuts_catch_a_preemption_that_saves_inside_the_sanity_check(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the generators' state taken inside the sanity check, whose draws Lightning undoes after it: caught
    # by the comparison, or by the save itself, whose folder the stopped run removes (it took no step)
    # while the background writer still writes into it
    mutate(monkeypatch, Resume, "on_exception", "if trainer.global_step == 0:", "if False:")
    with pytest.raises((AssertionError, FileNotFoundError)):
        cuts.assert_exact(cuts.resumed_after_a_sigterm_heard_by_lightning(), cuts.uninterrupted_in(workdir))
