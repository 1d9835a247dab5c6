"""A resumed image fit goes on with the images its checkpoint's run split, or says in one sentence why
not: images added, removed or edited since (a path, a label, a file size), or another seed or fraction,
would move held-out images into training. Evaluations of the checkpoint take any images."""

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from src.cli import CLI, main
from src.errors import UserInputError
from tests.conftest import BARE, CONFIGS, QUIET
from tests.test_resumed_data import assert_refused_then_resplit
from tests.test_run_folders import refused

CLASSES = ("cat", "dog", "owl")


def picture(path: Path, seed: int, value: int | None = None) -> None:
    """An 8x8 gray PNG of noise (or of one ``value``: a file of another size)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 8), dtype=np.uint8)
    Image.fromarray(pixels if value is None else np.full_like(pixels, value)).save(path)


def add(folder: Path, per_class: int, first: int) -> None:
    """``per_class`` images more in each class folder, numbered from ``first``."""
    for k, name in enumerate(CLASSES):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(first, first + per_class):
            picture(folder / name / f"{i:03d}.png", seed=1000 * k + i)


#: configs/images.yaml on the tiny folder: a CNN of widths 4, 8, two batches an epoch, no callbacks but
#: last.ckpt, in a named run (--ckpt_path last finds it)
WORDS = [
    "--config", str(CONFIGS / "images.yaml"), *BARE, "--trainer.callbacks=[]",
    "--last_checkpoint=src.callbacks.LatestCheckpoint", "--data.folder=images", "--data.batch_size=16",
    "--model.init_args.net.init_args.widths=[4, 8]", "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1", "--trainer.logger.init_args.version=r",
]  # fmt: skip


def fit(*words: str) -> CLI:
    return main(["fit", *WORDS, *words, *QUIET])


def resumed(*words: str) -> CLI:
    return fit("--trainer.max_epochs=2", "--ckpt_path=last", *words)


@pytest.fixture
def last(workdir: Path) -> Path:
    """One epoch on 90 images of three classes: its last.ckpt."""
    add(workdir / "images", 30, 0)
    first = fit("--trainer.max_epochs=1")
    return Path(first.trainer.log_dir) / "checkpoints" / "last.ckpt"


def test_a_resume_on_images_added_since_is_refused_and_goes_on_only_when_told(
    last: Path, workdir: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    add(workdir / "images", 2, 30)
    assert_refused_then_resplit(last, fit, capsys, caplog, "image", "6 images added")


@pytest.mark.parametrize(
    ("words", "change"),
    [
        (["--data.seed=7"], "data.seed=7 where it had 42"),
        (["--data.val_fraction=0.2"], "data.val_fraction=0.2 where it had 0.1"),
        (["--data.test_fraction=0.3"], "data.test_fraction=0.3 where it had 0.2"),
    ],
    ids=["seed", "val_fraction", "test_fraction"],
)
def test_a_resume_with_other_split_settings_is_refused(
    last: Path, capsys: pytest.CaptureFixture[str], words: list[str], change: str
) -> None:
    sentence = refused(capsys, lambda: resumed(*words))
    assert f"into training, validation and test ({change}), and a resumed fit" in sentence


def test_images_removed_edited_or_relabelled_are_named(
    last: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images, kept = workdir / "images", workdir / "kept"
    shutil.copytree(images, kept)

    def as_trained() -> None:
        shutil.rmtree(images)
        shutil.copytree(kept, images)

    for name in ("000", "001", "002"):
        (images / "cat" / f"{name}.png").unlink()
    assert "(3 images removed)" in refused(capsys, resumed)
    as_trained()
    for name in ("003", "004"):
        picture(images / "dog" / f"{name}.png", seed=0, value=7)  # rewritten: a file of another size
    assert "(2 images edited)" in refused(capsys, resumed)
    as_trained()
    shutil.move(images / "owl" / "005.png", images / "cat" / "owl.png")  # another label, the same bytes
    assert "(1 image edited)" in refused(capsys, resumed)


def test_a_resume_through_the_trainer_is_refused_too(last: Path, workdir: Path) -> None:
    """A fit resumed by ``trainer.fit(ckpt_path=...)``, not through the CLI, is checked on restore."""
    add(workdir / "images", 1, 30)
    run = main([*WORDS, "--trainer.max_epochs=2", *QUIET], run=False)
    with pytest.raises(UserInputError, match=r"\(3 images added\), and a resumed fit goes on"):
        run.trainer.fit(run.model, datamodule=run.datamodule, ckpt_path=str(last))


def test_a_checkpoint_that_recorded_no_split_resumes_on_any_images(last: Path, workdir: Path) -> None:
    checkpoint = torch.load(last, weights_only=True)
    del checkpoint["ImageDataModule"]["split"]  # as a checkpoint of an older version holds it
    torch.save(checkpoint, last)
    add(workdir / "images", 1, 30)
    assert resumed().trainer.current_epoch == 2


def test_the_same_images_resume_and_evaluations_take_any_images(last: Path, workdir: Path) -> None:
    """Unchanged images go on; test and predict from the checkpoint use its fitted state on whatever
    images they are given: a folder that has grown, new images to predict."""
    assert resumed().trainer.current_epoch == 2
    add(workdir / "images", 5, 30)
    tested = main(["test", f"--ckpt_path={last}", *QUIET])
    assert "test/loss" in tested.trainer.callback_metrics
    (workdir / "new").mkdir()
    for i in range(4):
        picture(workdir / "new" / f"{i}.png", seed=500 + i)
    out = workdir / "predictions.csv"
    main(["predict", f"--ckpt_path={last}", "--data.predict_path=new", f"--output={out}", *QUIET])
    assert pd.read_csv(out)["prediction"].isin(CLASSES).all()
    assert len(pd.read_csv(out)) == 4
