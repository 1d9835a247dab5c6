"""Break a mid-epoch resume on purpose: the proof that resumed equals uninterrupted must fail."""

from pathlib import Path

import pytest

import src.extras.resume.test_resume as resume
from src.data.loading import ResumableDataModule
from tests.test_mutations import mutate


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
