"""Images on the core: ImageDataModule, the CNNs, MisclassifiedImages, and the loop's proofs on image runs.

Most runs use tiny generated PNG files (8x8, three classes); the shipped configs/images.yaml is run
whole by the slow test at the end.
"""

import logging
import math
import os
import shutil
import struct
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from matplotlib.figure import Figure
from PIL import ExifTags, Image, ImageDraw, ImageFile, ImageFont
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader, DistributedSampler
from typing_extensions import override

import src.extras.tables.test_data as data_tests
from src.cli import CLI, main
from src.data.loading import ResumableLoader, keep_batch
from src.errors import UserInputError
from src.extras import images
from src.extras.images import ImageDataModule, write_digits
from src.extras.images.bench import Setup, measure, table
from src.extras.images.callback import BEST_TAG, TAG, EpochImages, MisclassifiedImages, first_misclassified
from src.extras.images.nets import ResNet, SmallCNN
from src.extras.images.predict import ImagePreprocessing
from src.models import Classifier
from tests.conftest import BARE, CONFIGS, QUIET
from tests.helpers import StopAt

# these tests also need the extras below; without one of them they are skipped
NonFiniteGuard = pytest.importorskip("src.extras.guard").NonFiniteGuard
scale_loss_at = pytest.importorskip("src.extras.guard.test_guard").scale_loss_at

CLASSES = ("cat", "dog", "owl")


def write_images(
    folder: Path,
    classes: tuple[str, ...] = CLASSES,
    per_class: int = 30,
    size: tuple[int, int] = (8, 8),
    mode: str = "L",
    seed: int = 0,
) -> Path:
    """Random PNG files in class folders; class k has bright rows k, k + K, ... (learnable, not trivial)."""
    rng = np.random.default_rng(seed)
    height, width = size
    for k, name in enumerate(classes):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            shape = (height, width) if mode == "L" else (height, width, 3)
            pixels = rng.integers(0, 120, size=shape, dtype=np.uint8)
            pixels[k :: len(classes)] += 100
            Image.fromarray(pixels).save(folder / name / f"{i:03d}.png")
    return folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_images(tmp_path / "images")


def decoded(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("L"), dtype=np.float64) / 255


# -- splits, statistics, state ------------------------------------------------------------------------


def test_splits_are_disjoint_stratified_and_seeded(folder: Path) -> None:
    dm = ImageDataModule(folder=str(folder), val_fraction=0.1, test_fraction=0.2)
    splits = dm.split_items
    together = np.concatenate(list(splits.values()))
    assert len(together) == len(set(together.tolist())) == 90  # disjoint, and every image in one
    labels = dm.source.labels
    for stage, per_class in {"train": 21, "val": 3, "test": 6}.items():  # 30 per class: 70/10/20 %
        names, counts = np.unique(labels[splits[stage]].astype(str), return_counts=True)
        assert names.tolist() == list(CLASSES)
        assert counts.tolist() == [per_class] * 3, stage
    again = ImageDataModule(folder=str(folder)).split_items
    other = ImageDataModule(folder=str(folder), seed=7).split_items
    for stage in splits:
        np.testing.assert_array_equal(splits[stage], again[stage])
    assert not np.array_equal(splits["train"], other["train"])


def test_statistics_are_fitted_on_the_training_split_only(folder: Path) -> None:
    dm = ImageDataModule(folder=str(folder))
    dm.setup("fit")
    train = np.stack([decoded(dm.source.paths[i]) for i in dm.split_items["train"]])
    mean, std = dm.stats
    torch.testing.assert_close(mean, torch.tensor([train.mean()], dtype=torch.float32))
    torch.testing.assert_close(std, torch.tensor([train.std()], dtype=torch.float32))
    everything = np.stack([decoded(path) for path in dm.source.paths])
    assert not math.isclose(mean.item(), everything.mean(), rel_tol=1e-6)
    # the batches a loader hands out are the decoded files, as uint8, in the split's order
    x, y = next(iter(dm.val_dataloader()))
    assert x.dtype == torch.uint8
    assert x.shape == (9, 1, 8, 8)
    first = dm.source.paths[dm.split_items["val"][0]]
    torch.testing.assert_close(x[0, 0].double() / 255, torch.from_numpy(decoded(first)))
    assert dm.label_names[int(y[0])] == first.parent.name


def test_in_memory_and_from_files_give_the_same_batches(folder: Path) -> None:
    memory, files = (ImageDataModule(folder=str(folder), in_memory=flag) for flag in (True, False))
    for dm in (memory, files):
        dm.setup("fit")
    torch.testing.assert_close(memory.stats, files.stats, rtol=0, atol=0)
    for a, b in zip(memory.train_dataloader(), files.train_dataloader(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_state_dict_round_trip_and_preprocessing_from(folder: Path, tmp_path: Path) -> None:
    dm = ImageDataModule(folder=str(folder), image_size=6, mode="RGB")
    dm.setup("fit")
    torch.save({"state_dict": {}, "ImageDataModule": dm.state_dict()}, tmp_path / "x.ckpt")
    state = torch.load(tmp_path / "x.ckpt", weights_only=True)["ImageDataModule"]  # tensors and data only
    assert state["label_names"] == list(CLASSES)
    assert (state["mode"], state["size"]) == ("RGB", [6, 6])
    other = ImageDataModule(folder=str(folder), seed=3)
    other.load_state_dict(state)
    assert (other.label_names, other.mode, other.size, other.in_features) == (list(CLASSES), "RGB", (6, 6), 3)
    torch.testing.assert_close(other.stats, dm.stats, rtol=0, atol=0)
    for generator in ("shuffle", "augment"):
        assert torch.equal(other.state_dict()[generator], dm.state_dict()[generator])
    # from the checkpoint alone: no folder is read for what was fitted
    one = folder / "dog" / "000.png"
    restored = ImageDataModule(
        folder=str(tmp_path / "gone"),  # no folder is read for what was fitted
        preprocessing_from=str(tmp_path / "x.ckpt"),
        predict_path=str(one),
        image_size=6,  # as the checkpoint's own data settings say (the CLI passes them on)
    )
    assert (restored.in_features, restored.out_features, restored.label_names) == (3, 3, list(CLASSES))
    torch.testing.assert_close(restored.stats, dm.stats, rtol=0, atol=0)
    restored.setup("predict")
    (x,) = next(iter(restored.predict_dataloader()))
    assert x.shape == (1, 3, 6, 6)  # resized to the checkpoint's size, in its mode


def test_the_bundled_example_is_written_whole_once_and_never_over_another_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "data" / "digits-images"
    saved = []
    real_save = Image.Image.save

    def save_then_die(self, fp, *args, **kwargs) -> None:
        saved.append(fp)
        if len(saved) == 50:
            raise KeyboardInterrupt  # killed while writing
        real_save(self, fp, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(Image.Image, "save", save_then_die)
        with pytest.raises(KeyboardInterrupt):
            write_digits(target, size=8)
    assert list((tmp_path / "data").iterdir()) == []  # no half-written folder, no leftover
    # a leftover of a process that is gone (killed with SIGKILL, say) is removed by the next writer
    gone = tmp_path / "data" / ".digits-images.partial-999999999"
    gone.mkdir()
    write_digits(target, size=8)
    assert not gone.exists()
    pngs = sorted(target.rglob("*.png"))
    assert len(pngs) == 1797
    assert sorted(p.name for p in target.iterdir() if p.is_dir()) == [str(k) for k in range(10)]
    with Image.open(pngs[0]) as first:
        assert first.size == (8, 8)
    stamp = pngs[0].stat().st_mtime_ns
    write_digits(target, size=8)  # there: used as it is
    assert pngs[0].stat().st_mtime_ns == stamp
    theirs = tmp_path / "theirs"
    (theirs / "0").mkdir(parents=True)
    (theirs / "0" / "mine.png").write_bytes(b"someone else's")
    with pytest.raises(UserInputError, match=r"'.*theirs' exists but was not written by src.extras.images"):
        write_digits(theirs, size=8)
    assert (theirs / "0" / "mine.png").read_bytes() == b"someone else's"


def test_the_bundled_example_is_read_back_through_the_folder_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(images, "EXAMPLE", tmp_path / "digits-images")
    monkeypatch.setattr(images, "write_digits", lambda: write_digits(tmp_path / "digits-images", size=8))
    dm = ImageDataModule()
    assert (dm.in_features, dm.out_features, dm.label_names) == (1, 10, [str(k) for k in range(10)])
    assert dm.source.paths[0] == tmp_path / "digits-images" / "0" / "0000.png"
    assert dm.size == (8, 8)


def test_a_csv_lists_images_by_relative_or_absolute_path(folder: Path) -> None:
    rows = [("cat/000.png", "small"), (str(folder / "dog" / "000.png"), "big")]
    rows += [(f"owl/{i:03d}.png", "big" if i % 2 else "small") for i in range(20)]
    pd.DataFrame(rows, columns=["path", "label"]).to_csv(folder / "list.csv", index=False)
    dm = ImageDataModule(csv=str(folder / "list.csv"))
    assert dm.label_names == ["big", "small"]
    assert dm.source.paths[:2] == [folder / "cat" / "000.png", folder / "dog" / "000.png"]
    assert dm.targets[:2].tolist() == [1, 0]


def test_predict_path_a_folder_at_any_depth_a_file_or_a_list(folder: Path) -> None:
    nested = folder / "dog" / "deeper"
    nested.mkdir()
    Image.open(folder / "cat" / "000.png").save(nested / "a.png")
    (folder / "dog" / "notes.txt").write_text("not an image")
    dm = ImageDataModule(folder=str(folder), predict_path=str(folder / "dog"))
    index = dm.predict_index()
    assert index.name == "path"
    assert index.tolist() == [str(p) for p in sorted((folder / "dog").rglob("*.png"))]
    assert str(nested / "a.png") in index
    files = [str(folder / "owl" / "001.png"), str(folder / "cat" / "002.png")]
    assert ImageDataModule(folder=str(folder), predict_path=files).predict_index().tolist() == files
    assert ImageDataModule(folder=str(folder), predict_path=files[0]).predict_index().tolist() == files[:1]
    # left out: the validation split, never the test split
    plain = ImageDataModule(folder=str(folder))
    expected = [str(plain.source.paths[i]) for i in plain.split_items["val"]]
    assert plain.predict_index().tolist() == expected


# -- augmentation -------------------------------------------------------------------------------------


def test_a_crop_keeps_the_shape_and_is_a_window_of_the_padded_image(folder: Path) -> None:
    dm = ImageDataModule(folder=str(folder), crop_padding=2)
    x = torch.rand(64, 3, 8, 8)
    out = dm.augment(x)
    assert out.shape == x.shape
    padded = F.pad(x, (2, 2, 2, 2))
    shifts = set()
    for b in range(len(x)):
        windows = {(dy, dx): padded[b, :, dy : dy + 8, dx : dx + 8] for dy in range(5) for dx in range(5)}
        found = [shift for shift, window in windows.items() if torch.equal(out[b], window)]
        assert found, b
        shifts.add(found[0])
    assert len(shifts) > 10  # random places, not one


def test_a_horizontal_flip_mirrors_about_half_the_images_and_only_when_asked(folder: Path) -> None:
    x = torch.rand(64, 1, 8, 8)
    flipping = ImageDataModule(folder=str(folder), crop_padding=0, horizontal_flip=True).augment(x)
    mirrored = [torch.equal(a, b.flip(-1)) for a, b in zip(flipping, x, strict=True)]
    kept = [torch.equal(a, b) for a, b in zip(flipping, x, strict=True)]
    assert all(m != k for m, k in zip(mirrored, kept, strict=True))
    assert 16 < sum(mirrored) < 48
    assert torch.equal(ImageDataModule(folder=str(folder), crop_padding=0).augment(x), x)


class Probe(L.LightningModule):
    """A linear model that records the images each step sees."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(64, 3)
        self.seen: dict[str, list[torch.Tensor]] = {"train": [], "val": [], "test": [], "predict": []}

    def step(self, batch: tuple[torch.Tensor, ...], stage: str) -> torch.Tensor:
        self.seen[stage].append(batch[0].clone())
        return self.net(batch[0].flatten(1)).logsumexp(-1).mean()

    @override
    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        return self.step(batch, "train")

    @override
    def validation_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        self.step(batch, "val")

    @override
    def test_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> None:
        self.step(batch, "test")

    @override
    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        return self.step(batch, "predict")

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def quiet_trainer(**kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, **kwargs,
    )  # fmt: skip


def test_augmentation_in_training_only_never_in_validation_test_or_predict(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dm = ImageDataModule(folder=str(folder), batch_size=16, crop_padding=2, horizontal_flip=True)
    augmented: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = dm.augment

    def counted(x: torch.Tensor) -> torch.Tensor:
        augmented.append((x, real(x)))
        return augmented[-1][1]

    monkeypatch.setattr(dm, "augment", counted)
    probe, trainer = Probe(), quiet_trainer(max_epochs=2, num_sanity_val_steps=0)
    trainer.fit(probe, datamodule=dm)
    trainer.test(probe, datamodule=dm, verbose=False)
    trainer.predict(probe, datamodule=dm)
    assert len(augmented) == len(probe.seen["train"]) == 2 * 4  # 63 training images in batches of 16
    # each evaluation stage sees its split as decoded, normalized with the training statistics: no crop
    for stage, split in (("val", "val"), ("test", "test"), ("predict", "val")):
        x = dm.dataset(split).tensors[0]  # type: ignore[attr-defined]
        expected = (x.float() / 255 - dm.stats[0]) / dm.stats[1]
        if stage == "val":
            expected = torch.cat([expected, expected])  # two epochs
        torch.testing.assert_close(torch.cat(probe.seen[stage]), expected, rtol=0, atol=0)
    # training steps see the training images (each once per epoch), cropped, then normalized the same way
    for (_, out), seen in zip(augmented, probe.seen["train"], strict=True):
        torch.testing.assert_close(seen, dm.normalize(out), rtol=0, atol=0)
    inputs = torch.cat([x for x, _ in augmented[:4]])
    train = dm.dataset("train").tensors[0]  # type: ignore[attr-defined]
    assert sorted(bytes(row) for row in (inputs * 255).round().to(torch.uint8).flatten(1).numpy()) == sorted(
        bytes(row) for row in train.flatten(1).numpy()
    )


# -- bad input: one sentence each ---------------------------------------------------------------------


def test_a_folder_without_images_is_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match=r"data.folder='.*empty' holds no images in class sub-folders"):
        _ = ImageDataModule(folder=str(tmp_path / "empty")).out_features
    write_images(tmp_path / "some", per_class=3)
    (tmp_path / "some" / "eel").mkdir()
    (tmp_path / "some" / "eel" / "readme.txt").write_text("no images here")
    with pytest.raises(UserInputError, match=r"the class folder 'eel' holds no images; add some or remove"):
        _ = ImageDataModule(folder=str(tmp_path / "some")).out_features


def test_a_corrupt_image_is_named(folder: Path) -> None:
    (folder / "cat" / "000.png").write_bytes(b"not a png at all")
    with pytest.raises(UserInputError, match=r"'.*cat/000.png' cannot be read as an image"):
        ImageDataModule(folder=str(folder)).setup("fit")
    write_images(folder)  # whole again
    whole = (folder / "dog" / "000.png").read_bytes()
    (folder / "dog" / "000.png").write_bytes(whole[: len(whole) // 2])  # cut short: the header reads
    with pytest.raises(UserInputError, match=r"'.*dog/000.png' cannot be read as an image"):
        ImageDataModule(folder=str(folder), mode="L", image_size=8).setup("fit")


def test_mixed_sizes_name_two_files_and_suggest_image_size(folder: Path) -> None:
    write_images(folder, classes=("owl",), per_class=1, size=(10, 12))
    with pytest.raises(UserInputError) as error:
        ImageDataModule(folder=str(folder)).setup("fit")
    assert str(error.value).startswith(f"data.folder={str(folder)!r} holds images of different sizes: ")
    cat, owl = str(folder / "cat" / "000.png"), str(folder / "owl" / "000.png")
    assert f"{cat!r} is 8x8 and {owl!r} is 12x10" in str(error.value)
    assert str(error.value).endswith("set data.image_size to resize them all to one size.")
    dm = ImageDataModule(folder=str(folder), image_size=8)
    dm.setup("fit")
    assert dm.dataset("train").tensors[0].shape[1:] == (1, 8, 8)  # type: ignore[attr-defined]


def test_a_csv_without_its_columns_or_naming_a_missing_file(folder: Path) -> None:
    pd.DataFrame({"file": ["cat/000.png"], "label": ["cat"]}).to_csv(folder / "a.csv", index=False)
    with pytest.raises(
        UserInputError, match=r"a.csv' has no 'path' column \(its columns: \['file', 'label'\]\)"
    ):
        _ = ImageDataModule(csv=str(folder / "a.csv")).out_features
    pd.DataFrame({"path": ["cat/000.png", "cat/gone.png"], "label": ["cat", "dog"]}).to_csv(
        folder / "b.csv", index=False
    )
    with pytest.raises(UserInputError, match=r"b.csv' row 2 names '.*cat/gone.png', which does not exist"):
        _ = ImageDataModule(csv=str(folder / "b.csv")).out_features


def test_fewer_than_two_classes_or_a_class_too_small_to_stratify(tmp_path: Path) -> None:
    write_images(tmp_path / "one", classes=("cat",))
    with pytest.raises(UserInputError, match=r"holds 1 class \(\['cat'\]\); classification needs at least 2"):
        _ = ImageDataModule(folder=str(tmp_path / "one")).out_features
    write_images(tmp_path / "rare", per_class=20)
    for path in sorted((tmp_path / "rare" / "owl").iterdir())[1:]:
        path.unlink()
    with pytest.raises(UserInputError, match=r"its smallest class 'owl' has 1 image\(s\): add images or"):
        ImageDataModule(folder=str(tmp_path / "rare")).setup("fit")


def test_the_cli_says_the_sentence_and_exits_2(cli, tmp_path: Path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit_:
        cli("fit", "--config", "images.yaml", f"--data.init_args.folder={tmp_path / 'empty'}")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "holds no images in class sub-folders" in err
    assert "Traceback" not in err


# -- the nets -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "net", [SmallCNN(3, 5, widths=(4, 8), dropout=0.1), ResNet(3, 5, widths=(4, 8), depth=2)]
)
def test_the_nets_serve_any_image_size(net: torch.nn.Module) -> None:
    for size in (8, 13, 32):
        assert net(torch.randn(2, 3, size, size)).shape == (2, 5)


def test_bad_net_arguments_are_sentences() -> None:
    with pytest.raises(ValueError, match=r"SmallCNN widths=\[\]: give at least one width"):
        SmallCNN(1, 2, widths=())
    with pytest.raises(ValueError, match=r"ResNet depth=0 must be at least 1"):
        ResNet(1, 2, depth=0)
    with pytest.raises(ValueError, match=r"ResNet dropout=1.0 must lie in \[0, 1\)"):
        ResNet(1, 2, dropout=1.0)


# -- image runs through the CLI: resume, accumulation, guard, DDP --------------------------------------


def tiny(folder: Path, *extra: str) -> list[str]:
    """configs/images.yaml on the tiny folder: a CNN of widths 4, 8; no shipped callbacks, no images grid."""
    return [
        "--config", str(CONFIGS / "images.yaml"), *BARE, "--trainer.callbacks=[]",
        f"--data.init_args.folder={folder}", "--data.init_args.batch_size=16",
        "--model.init_args.net.init_args.widths=[4, 8]", *extra, *QUIET,
    ]  # fmt: skip


EPOCHS, BATCHES = 3, 4  # 63 training images in batches of 16
#: dropout, crop and flip on, and the config's cosine schedule over the run (whose length the task asks
#: the Trainer for while the optimizers are configured, before Lightning restores the loader's state)
RESUMABLE = (
    f"--trainer.max_epochs={EPOCHS}", "--model.init_args.net.init_args.dropout=0.3",
    "--data.init_args.horizontal_flip=true", "--resume=src.extras.resume.Resume",
    "--trainer.logger=false", "--trainer.enable_checkpointing=false",
)  # fmt: skip


def fitted(run: CLI, ckpt_path: str | None = None) -> CLI:
    run.trainer.fit(run.model, datamodule=run.datamodule, ckpt_path=ckpt_path)
    return run


def same_weights(a: CLI, b: CLI) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True)
    )


class ForgetsTheCrops(ImageDataModule):
    """Restores all of a checkpoint's state but the augmentation's generator, which starts again."""

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict({**state_dict, "augment": torch.Generator().manual_seed(42).get_state()})


@pytest.mark.slow
def test_an_image_run_resumed_mid_epoch_equals_the_uninterrupted_run(folder: Path, workdir: Path) -> None:
    step = BATCHES + 2  # after the second batch of epoch 1

    def build(*callbacks: Callback) -> CLI:
        run = main(tiny(folder, *RESUMABLE), run=False)
        # the run that writes the checkpoint and those that resume from it have the same callbacks, whose
        # states Lightning restores (a ModelCheckpoint of another folder has the same state key)
        saver = ModelCheckpoint(dirpath=workdir / str(len(os.listdir(workdir))), every_n_train_steps=step)
        run.trainer.callbacks.extend([saver, *callbacks])
        return run

    uninterrupted = fitted(build())
    assert uninterrupted.model.net.dropout.p == 0.3
    assert uninterrupted.datamodule.settings.crop_padding > 0
    first = build(StopAt(step))
    fitted(first)
    (middle,) = Path(first.trainer.checkpoint_callback.dirpath).glob("*.ckpt")
    checkpoint = torch.load(middle, weights_only=True)
    assert (checkpoint["global_step"], checkpoint["epoch"]) == (step, 1)
    assert isinstance(first.trainer.train_dataloader, ResumableLoader)
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["done"] == 2
    resumed = fitted(build(), str(middle))
    assert resumed.trainer.global_step == uninterrupted.trainer.global_step == EPOCHS * BATCHES
    for (name, a), b in zip(
        resumed.model.state_dict().items(), uninterrupted.model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    torch.testing.assert_close(
        resumed.trainer.callback_metrics["val/loss"], uninterrupted.trainer.callback_metrics["val/loss"],
        rtol=0, atol=0,
    )  # fmt: skip
    # not vacuous: a resume whose augmentation starts its draws again crops otherwise, and ends elsewhere
    forgetful = build()
    arguments = {k: v for k, v in forgetful.datamodule.hparams.items() if not k.startswith("_")}
    forgetful.trainer.fit(forgetful.model, datamodule=ForgetsTheCrops(**arguments), ckpt_path=str(middle))
    assert forgetful.trainer.global_step == EPOCHS * BATCHES
    assert not same_weights(forgetful, uninterrupted)


#: for equivalences with a batch of another size: plain SGD (whose step shows a gradient's scale, which
#: Adam's hides), no clipping (it acts on sums), no BatchNorm (the statistics of B images are not those of
#: 2B), no dropout, no crop or flip (drawn per batch: two batches of B would be cropped otherwise)
EQUIVALENT = (
    "--model.init_args.net.init_args.batch_norm=false", "--model.init_args.net.init_args.dropout=0",
    "--data.init_args.crop_padding=0", "--model.init_args.optimizer=torch.optim.SGD",
    "--model.init_args.optimizer.init_args.lr=0.5", "--model.init_args.optimizer.init_args.weight_decay=0",
    "--model.init_args.scheduler=null", "--config", str(CONFIGS / "trainer" / "no_clip.yaml"),
    "--trainer.max_epochs=2", "--trainer.logger=false", "--trainer.enable_checkpointing=false",
)  # fmt: skip


def test_accumulating_two_batches_equals_one_batch_twice_the_size(folder: Path, workdir: Path) -> None:
    small = main(
        tiny(folder, *EQUIVALENT, "--data.init_args.batch_size=8", "--trainer.accumulate_grad_batches=2",
             "--trainer.limit_train_batches=6"),
        run=False,
    )  # fmt: skip
    big = main(
        tiny(folder, *EQUIVALENT, "--data.init_args.batch_size=16", "--trainer.limit_train_batches=3"),
        run=False,
    )
    assert small.trainer.accumulate_grad_batches == 2
    assert small.trainer.gradient_clip_val is None
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in small.model.modules())
    assert small.model.net.dropout.p == 0
    start = {k: v.clone() for k, v in small.model.state_dict().items()}
    torch.testing.assert_close(start, big.model.state_dict(), rtol=0, atol=0)  # same seed, same weights
    fitted(small), fitted(big)
    assert small.trainer.global_step == big.trainer.global_step == 6
    torch.testing.assert_close(small.model.state_dict(), big.model.state_dict(), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(start["net.head.weight"], small.model.state_dict()["net.head.weight"])


@pytest.mark.slow
def test_the_guard_skips_a_nan_step_of_an_image_run(folder: Path, workdir: Path, caplog) -> None:
    words = tiny(
        folder, "--nonfinite_guard=src.extras.guard.NonFiniteGuard", "--trainer.max_epochs=2",
        "--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.init_args.lr=0.1",
        "--model.init_args.optimizer.init_args.weight_decay=0", "--model.init_args.scheduler=null",
        "--trainer.logger=false", "--trainer.enable_checkpointing=false",
    )  # fmt: skip
    skipped = main(words, run=False)
    scale_loss_at(skipped, {3}, math.nan)
    fitted(skipped)
    guard = next(c for c in skipped.trainer.callbacks if isinstance(c, NonFiniteGuard))
    assert guard.skipped == 1
    assert "Skipped the optimizer step at epoch 0, batch 3: non-finite gradients in net." in caplog.text
    # plain SGD: a step with zero gradients leaves the weights where they were, as a skipped step must
    zeroed = main(words, run=False)
    scale_loss_at(zeroed, {3}, 0.0)
    fitted(zeroed)
    for (name, a), b in zip(
        skipped.model.state_dict().items(), zeroed.model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
        assert torch.isfinite(a).all() if a.is_floating_point() else True


B = 8  # per process


class RankWeights(Callback):
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.save(
            {
                "step": trainer.global_step,
                "weights": {k: v.clone() for k, v in pl_module.state_dict().items()},
            },
            self.folder / f"rank{trainer.global_rank}.pt",
        )


class SameOrderAsTwoProcesses(ImageDataModule):
    """One process, batches of 2B in the order two DDP processes together see them (see test_distributed)."""

    @override
    def train_dataloader(self) -> DataLoader:
        dataset = super().train_dataloader().dataset
        sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=42)
        return DataLoader(dataset, batch_size=2 * B, sampler=sampler, collate_fn=keep_batch)


def test_ddp_two_processes_equal_one_process_with_twice_the_batch(tmp_path: Path, workdir: Path) -> None:
    """ddp_fork on the CPU, as tests/test_distributed.py runs it in-process (ddp_spawn would pickle the
    run to fresh processes, several seconds more)."""
    folder = write_images(tmp_path / "images", per_class=31)  # 64 training images: 4 x 2B, no padding
    same = (*EQUIVALENT, "--trainer.num_sanity_val_steps=0")
    two = main(
        tiny(folder, *same, "--config", str(CONFIGS / "trainer" / "ddp.yaml"), "--trainer.strategy=ddp_fork",
             f"--data.init_args.batch_size={B}"),
        run=False,
    )  # fmt: skip
    assert two.trainer.world_size == 2
    two.trainer.callbacks.append(RankWeights(workdir))
    fitted(two)
    ranks = [torch.load(workdir / f"rank{r}.pt", weights_only=True) for r in range(2)]
    torch.testing.assert_close(ranks[0]["weights"], ranks[1]["weights"], rtol=0, atol=0)  # replicas agree
    one = main(tiny(folder, *same, f"--data.init_args.batch_size={2 * B}"), run=False)
    arguments = {k: v for k, v in one.datamodule.hparams.items() if not k.startswith("_")}
    one.trainer.fit(one.model, datamodule=SameOrderAsTwoProcesses(**arguments))
    assert one.trainer.global_step == ranks[0]["step"] == 2 * 4  # 4 steps of 2 x 8 images per epoch
    reference = {k: v for k, v in one.model.state_dict().items() if k in ranks[0]["weights"]}
    torch.testing.assert_close(ranks[0]["weights"], reference, rtol=1e-5, atol=1e-6)


# -- MisclassifiedImages ------------------------------------------------------------------------------


def test_the_first_misclassified_images_are_kept_in_order_across_batches() -> None:
    images = torch.arange(10.0).view(10, 1, 1, 1)
    target = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    predicted = torch.tensor([0, 2, 2, 1, 1, 0, 0, 0, 2, 1])  # wrong at 1, 3, 5, 7, 9
    kept = first_misclassified(None, images[:4], target[:4], predicted[:4], count=3)
    assert kept[3].tolist() == [True, True, False]  # 1 and 3 wrong so far, one correct one filling up
    kept = first_misclassified(kept, images[4:], target[4:], predicted[4:], count=3)
    assert kept[0].flatten().tolist() == [1.0, 3.0, 5.0]
    assert kept[1].tolist() == [1, 0, 2]
    assert kept[2].tolist() == [2, 1, 0]
    assert kept[3].all()


def test_the_grid_titles_each_image_true_then_predicted() -> None:
    target, predicted = torch.tensor([0, 1, 2, 0, 1]), torch.tensor([1, 2, 0, 2, 0])
    epoch = EpochImages(4, 40, torch.rand(5, 3, 8, 8), target, predicted, ["cat", "dog", "owl"])
    figure = MisclassifiedImages(panel_size=100).figure(epoch)
    (ax,) = figure.axes  # in inches from the top left
    titles = [(text.get_text(), text.get_position()) for text in ax.texts]
    assert [text for text, _ in titles] == ["cat → dog", "dog → owl", "owl → cat", "cat → owl", "dog → cat"]
    # a 2 x 3 grid of 1-inch panels, each title centred above its image
    corners = [(image.get_extent()[0], image.get_extent()[3]) for image in ax.images]
    assert len({x for x, _ in corners}) == 3
    assert len({y for _, y in corners}) == 2
    for (_, (x, y)), (left, top) in zip(titles, corners, strict=True):
        assert x == pytest.approx(left + 0.5)
        assert top - 0.25 < y < top


def test_a_long_label_is_cut_in_the_grid_titles() -> None:
    epoch = EpochImages(0, 0, torch.rand(2, 1, 8, 8), torch.tensor([0, 1]), torch.tensor([1, 0]),
                        ["a label of thirty characters!", "short"])  # fmt: skip
    (ax,) = MisclassifiedImages().figure(epoch).axes
    assert [text.get_text() for text in ax.texts] == ["a label of… → short", "short → a label of…"]


def grid_events(folder: Path, tmp_path: Path, callback: MisclassifiedImages) -> EventAccumulator:
    """The images a 5-epoch fit (4 steps an epoch) writes with ``callback``, read back."""
    dm = ImageDataModule(folder=str(folder), batch_size=16)
    model = Classifier(in_features=1, out_features=3, net=lambda i, o: SmallCNN(i, o, widths=(4,)))
    logger = TensorBoardLogger(tmp_path / "logs", name="run")
    trainer = L.Trainer(accelerator="cpu", max_epochs=5, logger=logger, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[callback])  # fmt: skip
    trainer.fit(model, datamodule=dm)
    return EventAccumulator(logger.log_dir, size_guidance={"images": 0}).Reload()


def grid_steps(folder: Path, tmp_path: Path, callback: MisclassifiedImages) -> list[int]:
    """The steps of the grids a 5-epoch fit (4 steps an epoch) writes with ``callback``."""
    return [event.step for event in grid_events(folder, tmp_path, callback).Images(TAG)]


def test_misclassified_images_reach_tensorboard_every_n_epochs_and_at_the_end(
    folder: Path, tmp_path: Path
) -> None:
    steps = grid_steps(folder, tmp_path, MisclassifiedImages(3, max_images=5, max_share=None))
    # each validation's images at its last step: epochs 0 and 3 (every 3rd), and the last
    assert steps == [3, 15, 19]


class CountedGrids(MisclassifiedImages):
    """Counts the grids it draws."""

    grids = 0

    @override
    def figure(self, epoch: EpochImages, title: str = "") -> Figure:
        self.grids += 1
        return super().figure(epoch, title)


def test_a_best_epoch_already_drawn_is_written_again_not_redrawn(folder: Path, tmp_path: Path) -> None:
    """Every epoch drawn: the best one's grid under ``summary/`` is the very image of its ``val/`` grid, and
    five epochs draw five grids, not six."""
    callback = CountedGrids(1, max_images=5, max_share=None)
    events = grid_events(folder, tmp_path, callback)
    drawn = {event.step: event.encoded_image_string for event in events.Images(TAG)}
    (best,) = events.Images(BEST_TAG)
    assert sorted(drawn) == [3, 7, 11, 15, 19]
    assert best.encoded_image_string == drawn[best.step]
    assert callback.grids == 5


@pytest.mark.parametrize(("share", "drawn"), [(None, [3, 7, 11, 15, 19]), (1e-9, [3, 19])])
def test_misclassified_images_keep_to_their_share_of_the_fit(
    folder: Path, tmp_path: Path, share: float | None, drawn: list[int]
) -> None:
    """Asked for every epoch: with no share all five are drawn; with a share no grid's drawing fits in, the
    first epoch's and the last's alone."""
    assert grid_steps(folder, tmp_path, MisclassifiedImages(1, max_images=5, max_share=share)) == drawn


def test_a_module_without_preds_gets_one_line_and_no_images(folder: Path, tmp_path: Path, caplog) -> None:
    dm = ImageDataModule(folder=str(folder), batch_size=16)
    logger = TensorBoardLogger(tmp_path / "logs", name="run")
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, logger=logger, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[MisclassifiedImages(every_n_epochs=1)])  # fmt: skip
    with caplog.at_level(logging.INFO):
        trainer.fit(Probe(), datamodule=dm)
    said = [r.getMessage() for r in caplog.records if "MisclassifiedImages" in r.getMessage()]
    assert said == [
        "MisclassifiedImages draws the classes predictions(output) names for the {'output', 'target'} dict "
        "validation_step returns; Probe offers none, so no images are drawn."
    ]
    assert TAG not in EventAccumulator(logger.log_dir).Reload().Tags()["images"]


# -- through the CLI: fit, then predict from the checkpoint alone --------------------------------------


@pytest.mark.slow
def test_fit_then_predict_a_folder_from_the_checkpoint_alone(
    folder: Path, tmp_path: Path, workdir: Path
) -> None:
    fit = main([
        "fit", *tiny(folder, "--trainer.max_epochs=2"),
        "--last_checkpoint=src.callbacks.LatestCheckpoint",
    ])  # fmt: skip
    ckpt = Path(fit.trainer.log_dir) / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    new = write_images(tmp_path / "new", classes=("any",), per_class=5, seed=9)
    out = tmp_path / "predictions.csv"
    main(["predict", "--ckpt_path", str(ckpt), "--data.predict_path", str(new), "--output", str(out), *QUIET])
    frame = pd.read_csv(out)
    labels = [f"probability({name})" for name in CLASSES]
    assert list(frame.columns) == ["path", "prediction", *labels]
    assert frame["path"].tolist() == [str(p) for p in sorted(new.rglob("*.png"))]
    # the model's own outputs on those images, normalized with the checkpoint's statistics
    model = Classifier.load_from_checkpoint(ckpt).eval()
    data = ImageDataModule(preprocessing_from=str(ckpt), predict_path=str(new))
    x = data.dataset("predict").tensors[0]  # type: ignore[attr-defined]
    with torch.no_grad():
        probs = model(data.normalize(x.float() / 255)).softmax(-1)
    torch.testing.assert_close(torch.tensor(frame[labels].to_numpy(), dtype=torch.float32), probs)
    assert frame["prediction"].tolist() == [CLASSES[k] for k in probs.argmax(-1).tolist()]


# -- the benchmark, on tiny sizes ---------------------------------------------------------------------


def test_the_loader_benchmark_counts_every_image_of_every_epoch(folder: Path) -> None:
    setup = Setup(folder=str(folder), batch_size=16, epochs=2, workers=(0, 1))
    results = measure(setup, rounds=1)
    assert list(results.runs) == [(True, 0), (True, 1), (False, 0), (False, 1)]
    for key, (run,) in results.runs.items():
        assert run.images == 2 * 63, key
        assert 0 < run.seconds < 1e6, key  # not the time since the epoch
    rows = [line for line in table(results).splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 4
    assert [row.strip("| ").split(" | ")[4] for row in rows[1:]][::2] == [
        "1.00",
        "1.00",
    ]  # 0 workers: the reference


# -- the shipped config -------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_shipped_images_config_reaches_97_percent_test_accuracy(cli) -> None:
    run = cli("fit", "--config", "images.yaml", "--test_after_fit=true")
    assert run.trainer.callback_metrics["test/acc"] >= 0.97


# -- one reading rule for every mode Pillow opens ------------------------------------------------------

#: what a viewer applies for each EXIF orientation (the EXIF standard's table), as the transposition that
#: undoes it: a file stored as ``UNDO[o](picture)`` with orientation ``o`` shows ``picture``
UNDO = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,  # the viewer turns it 90° clockwise (ROTATE_270): stored a quarter back
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def picture(seed: int = 0, size: tuple[int, int] = (7, 5)) -> np.ndarray:
    """An 8-bit colour picture, ``(H, W, 3)``: every value 0…255 likely, not square (turns show)."""
    return np.random.default_rng(seed).integers(0, 256, size=(*size, 3), dtype=np.uint8)


def composited(gray_or_rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Over white, as a viewer shows it: exact where alpha is 0 or 255 (the cases tested exactly)."""
    a = alpha.astype(np.float64)[..., None] if gray_or_rgb.ndim == 3 else alpha.astype(np.float64)
    return np.rint((gray_or_rgb * a + 255 * (255 - a)) / 255).astype(np.uint8)


def variants(folder: Path) -> dict[str, tuple[Path, Image.Image, int]]:
    """Per case: a file in some Pillow mode, the 8-bit copy of the same picture a viewer shows (L, RGB or
    RGBA), and the largest difference allowed (0 but for YCbCr, which Pillow's conversion rounds)."""
    folder.mkdir(parents=True, exist_ok=True)
    rgb = picture()
    gray = rgb[..., 0]
    shape = (gray > 127).astype(np.uint8) * 255  # binary: an icon's shape
    cases: dict[str, tuple[Path, Image.Image, int]] = {}

    def case(name: str, image: Image.Image, copy: Image.Image, suffix: str = ".png", atol: int = 0) -> None:
        image.save(folder / f"{name}{suffix}")
        with Image.open(folder / f"{name}{suffix}") as reopened:  # saved as the mode named, not another
            assert reopened.mode == name.split("-")[0].replace("_", ";"), (name, reopened.mode)
        cases[name] = (folder / f"{name}{suffix}", copy, atol)

    case("1", Image.fromarray(gray > 127), Image.fromarray(shape))
    case("L", Image.fromarray(gray), Image.fromarray(gray))
    case("I_16", Image.fromarray(gray.astype(np.uint16) * 257), Image.fromarray(gray))  # 0…65535
    case("I", Image.fromarray(gray.astype(np.int32) * 257, "I"), Image.fromarray(gray), ".tif")
    case("F", Image.fromarray(gray.astype(np.float32) / 255, "F"), Image.fromarray(gray), ".tif")  # 0…1
    palette = Image.fromarray(rgb).quantize(16)
    case("P", palette, palette.convert("RGB"))
    see_through = palette.copy()
    see_through.info["transparency"] = 0  # palette entry 0 transparent
    alpha_of_p = np.where(np.asarray(palette) == 0, 0, 255).astype(np.uint8)
    case(
        "P-transparent",
        see_through,
        Image.fromarray(np.dstack([np.asarray(palette.convert("RGB")), alpha_of_p])),
    )
    case(
        "LA",
        Image.fromarray(np.dstack([gray, shape]), "LA"),
        Image.fromarray(np.dstack([gray, gray, gray, shape])),
    )
    icon = np.dstack([np.zeros_like(rgb), shape])  # black, its shape in alpha alone
    case("RGBA", Image.fromarray(icon), Image.fromarray(icon))
    case("CMYK", Image.fromarray(rgb).convert("CMYK"), Image.fromarray(rgb), ".tif")
    case("YCbCr", Image.fromarray(rgb).convert("YCbCr"), Image.fromarray(rgb), ".tif", atol=3)
    for turn in range(2, 9):  # the picture stored turned back, its EXIF orientation turning it upright
        exif = Image.Exif()
        exif[ExifTags.Base.Orientation] = turn
        stored = Image.fromarray(rgb).transpose(UNDO[turn])
        stored.save(folder / f"exif-{turn}.png", exif=exif)
        cases[f"RGB-exif-{turn}"] = (folder / f"exif-{turn}.png", Image.fromarray(rgb), 0)
    return cases


def expected(copy: Image.Image, mode: str) -> np.ndarray:
    """The 8-bit copy in ``mode``: by Pillow's 8-bit conversions, transparency composited on white with
    numpy, alpha 255 where the copy has none."""
    pixels = np.asarray(copy)
    if copy.mode == "RGBA" and mode != "RGBA":
        flat = Image.fromarray(composited(pixels[..., :3], pixels[..., 3]))
        return np.asarray(flat.convert(mode)).reshape(copy.height, copy.width, -1)
    return np.asarray(copy.convert(mode)).reshape(copy.height, copy.width, -1)


@pytest.fixture(scope="module")
def modes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Image.Image, int]]:
    return variants(tmp_path_factory.mktemp("modes"))


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA"])
@pytest.mark.parametrize(
    "case",
    ["1", "L", "I_16", "I", "F", "P", "P-transparent", "LA", "RGBA", "CMYK", "YCbCr",
     *(f"RGB-exif-{turn}" for turn in range(2, 9))],
)  # fmt: skip
def test_every_mode_reads_as_its_8_bit_copy(
    modes: dict[str, tuple[Path, Image.Image, int]], case: str, mode: str
) -> None:
    path, copy, atol = modes[case]
    got = images.decode(path, mode, (7, 5), resize=False).permute(1, 2, 0)  # type: ignore[arg-type]
    want = torch.from_numpy(expected(copy, mode).copy())
    torch.testing.assert_close(got, want, rtol=0, atol=atol)
    # the header says the size a viewer shows and whether there is transparency, before any decoding
    seen = images.header(path)
    assert seen.size == (7, 5)
    assert seen.alpha == (copy.mode == "RGBA")


def test_the_predictor_and_the_server_read_a_file_by_the_same_rule(
    modes: dict[str, tuple[Path, Image.Image, int]],
) -> None:
    for path, _, _ in modes.values():
        for mode in ("L", "RGB", "RGBA"):
            reference = images.decode(path, mode, (7, 5), resize=False).permute(1, 2, 0)
            preprocessing = ImagePreprocessing([], mode, (7, 5), False, torch.zeros(1), torch.ones(1))  # type: ignore[arg-type]
            for given in (path, str(path), path.read_bytes()):
                torch.testing.assert_close(preprocessing.read(given, "x"), reference, rtol=0, atol=0)
            with Image.open(path) as opened:
                torch.testing.assert_close(preprocessing.read(opened, "x"), reference, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("cases", "mode"),
    [
        (["L", "I_16", "F", "1"], "L"),
        (["L", "CMYK"], "RGB"),
        (["L", "P"], "RGB"),
        (["L", "LA"], "RGBA"),
        (["P-transparent", "RGB-exif-6"], "RGBA"),
    ],
)
def test_a_folder_is_read_in_the_mode_that_loses_nothing_and_a_mix_is_said(
    modes: dict[str, tuple[Path, Image.Image, int]], tmp_path: Path, cases: list[str], mode: str, caplog
) -> None:
    for k, case in enumerate(cases):
        for label in ("a", "b"):
            (tmp_path / label).mkdir(exist_ok=True)
            source = modes[case][0]
            for i in range(5):
                shutil.copy(source, tmp_path / label / f"{k}-{i}{source.suffix}")
    with caplog.at_level(logging.INFO):
        dm = ImageDataModule(folder=str(tmp_path), val_fraction=0.2, test_fraction=0.2)
        assert (dm.mode, dm.in_features) == (mode, images.CHANNELS[mode])
    said = [r.getMessage() for r in caplog.records if "mixes image modes" in r.getMessage()]
    assert len(said) == 1
    assert said[0].startswith(f"data.folder={str(tmp_path)!r} mixes image modes: 10 ")
    assert f"all are read as {mode} by one rule (EXIF orientation applied" in said[0]
    dm.setup("fit")  # every file decodes in that mode
    assert dm.dataset("train").tensors[0].shape[1:] == (images.CHANNELS[mode], 7, 5)  # type: ignore[attr-defined]


def test_one_mode_in_a_folder_is_no_news(folder: Path, caplog) -> None:
    with caplog.at_level(logging.INFO):
        assert ImageDataModule(folder=str(folder)).mode == "L"
    assert "mixes image modes" not in caplog.text


LETTERS = "ABCDE"


def letters(folder: Path, variant: str, per_class: int = 40, seed: int = 0) -> Path:
    """Bright letters A to E on a dark, noisy 20x20 ground, placed and tilted at random; the same pictures
    (same seed) in each ``variant``: ``8-bit`` (L PNG files, the copy), ``16-bit`` (I;16 PNG, 0…65535),
    ``exif`` (each stored turned by a random EXIF orientation that turns it back), ``alpha`` (black RGBA
    icons whose shape is in the alpha channel alone: over white they show the 8-bit picture)."""
    rng, turns = np.random.default_rng(seed), np.random.default_rng(seed + 1)  # the same pictures in each
    font = ImageFont.load_default(size=14)
    for letter in LETTERS:
        (folder / letter).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            glyph = Image.new("L", (20, 20), 0)
            ImageDraw.Draw(glyph).text(
                tuple(rng.integers(2, 7, size=2).tolist()), letter, fill=255, font=font
            )
            glyph = glyph.rotate(float(rng.uniform(-15, 15)), resample=Image.Resampling.BILINEAR)
            ground = rng.integers(0, 80, size=(20, 20))
            gray = np.maximum(ground, np.asarray(glyph) * rng.uniform(0.7, 1.0)).astype(np.uint8)
            path = folder / letter / f"{i:03d}.png"
            if variant == "8-bit":
                Image.fromarray(gray).save(path)
            elif variant == "16-bit":
                Image.fromarray(gray.astype(np.uint16) * 257).save(path)
            elif variant == "exif":
                turn = int(turns.integers(1, 9))
                exif = Image.Exif()
                exif[ExifTags.Base.Orientation] = turn
                stored = Image.fromarray(gray)
                (stored if turn == 1 else stored.transpose(UNDO[turn])).save(path, exif=exif)
            else:  # black over white shows 255 - alpha: the picture is in the alpha channel alone
                Image.fromarray(np.dstack([np.zeros((20, 20, 3), np.uint8), 255 - gray])).save(path)
    return folder


def letters_run(folder: Path, *extra: str) -> CLI:
    """configs/images.yaml's CNN (widths 8, 16), no augmentation, on a letters folder: fitted."""
    run = main(
        tiny(folder, "--model.init_args.net.init_args.widths=[8, 16]", "--data.init_args.crop_padding=0",
             "--trainer.logger=false", "--trainer.enable_checkpointing=false", *extra),
        run=False,
    )  # fmt: skip
    return fitted(run)


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "mode"), [("16-bit", None), ("exif", None), ("alpha", "L")])
def test_a_16_bit_an_exif_turned_and_an_alpha_data_set_train_as_their_8_bit_copy(
    tmp_path: Path, workdir: Path, variant: str, mode: str | None
) -> None:
    """The same pictures read to the same pixels: the same run, weight for weight (the alpha icons read in
    L are composited on white, which shows the 8-bit picture)."""
    copy = letters_run(letters(tmp_path / "copy", "8-bit", per_class=12), "--trainer.max_epochs=2")
    words = ["--trainer.max_epochs=2", *([f"--data.init_args.mode={mode}"] if mode else [])]
    other = letters_run(letters(tmp_path / variant, variant, per_class=12), *words)
    assert other.datamodule.mode == copy.datamodule.mode == "L"
    torch.testing.assert_close(other.datamodule.stats, copy.datamodule.stats, rtol=0, atol=0)
    torch.testing.assert_close(other.model.state_dict(), copy.model.state_dict(), rtol=0, atol=0)
    assert other.trainer.global_step == copy.trainer.global_step > 0


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["16-bit", "exif", "alpha"])
def test_each_kind_of_file_trains_to_the_accuracy_of_its_8_bit_copy(
    tmp_path: Path, workdir: Path, variant: str
) -> None:
    """In the mode each folder gets when left out (the alpha icons: RGBA, four channels), 30 epochs."""
    long = ("--trainer.max_epochs=30", "--data.init_args.test_fraction=0.3")

    def accuracy(run: CLI) -> float:
        (metrics,) = run.trainer.test(run.model, datamodule=run.datamodule, verbose=False)
        return metrics["test/acc"]

    copy = letters_run(letters(tmp_path / "copy", "8-bit", per_class=60), *long)
    other = letters_run(letters(tmp_path / variant, variant, per_class=60), *long)
    assert other.datamodule.mode == ("RGBA" if variant == "alpha" else "L")
    assert accuracy(copy) >= 0.8  # well above chance (0.2): the comparison means something
    assert accuracy(other) >= accuracy(copy) - 0.05


# -- every way Pillow fails on a file, and inputs that would block, are one sentence ---------------------

#: what Pillow's plugins raise on damaged files (a truncated gAMA chunk: ValueError; a short read in a
#: header: struct.error; and the rest), and its guard against decompression bombs
PILLOW_FAILURES = [
    OSError("broken data stream when reading image file"),
    SyntaxError("broken PNG file"),
    ValueError("Truncated gAMA chunk"),
    struct.error("unpack requires a buffer of 4 bytes"),
    EOFError("no more images in GIF file"),
    IndexError("index out of range"),
    TypeError("bad operand type"),
    ZeroDivisionError("division by zero"),
    MemoryError(),
    Image.DecompressionBombError("Image size (400000000 pixels) exceeds limit of 178956970 pixels."),
]


@pytest.mark.parametrize("error", PILLOW_FAILURES, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("when", ["open", "decode"])
def test_every_way_pillow_fails_on_a_file_is_one_sentence_naming_it(
    folder: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, when: str
) -> None:
    path = folder / "cat" / "000.png"
    real_open = Image.open

    def failing_open(fp: object, *args: object, **kwargs: object) -> Image.Image:
        if str(fp) == str(path):
            raise error
        return real_open(fp, *args, **kwargs)  # type: ignore[arg-type]

    def failing_load(self: ImageFile.ImageFile) -> None:
        raise error

    if when == "open":
        monkeypatch.setattr(Image, "open", failing_open)
    else:
        monkeypatch.setattr(ImageFile.ImageFile, "load", failing_load)
    start = f"{str(path)!r} " if when == "open" else "'"
    ending = "shrink it, or raise PIL.Image.MAX_IMAGE_PIXELS if you trust the file."
    if not isinstance(error, Image.DecompressionBombError):
        ending = "replace or remove it."
    for read in (
        lambda: ImageDataModule(folder=str(folder)).setup("fit"),  # the headers, then the pixels
        lambda: ImagePreprocessing([], "L", (8, 8), False, torch.zeros(1), torch.ones(1)).read(
            path, repr(str(path))
        ),
    ):
        with pytest.raises(UserInputError) as refused:
            read()
        sentence = str(refused.value)
        assert sentence.startswith(start), sentence
        assert sentence.endswith(ending), sentence
        assert "\n" not in sentence


def with_chunk(png: bytes, kind: bytes, data: bytes) -> bytes:
    """A PNG file with one more chunk after its header (IHDR), its CRC right."""
    chunk = struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return png[: 8 + 25] + chunk + png[8 + 25 :]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda png: with_chunk(png, b"gAMA", b"\x00\x01"), "Truncated gAMA chunk"),  # 2 bytes, not 4
        (lambda png: with_chunk(png, b"pHYs", b"\x00"), "Truncated pHYs chunk"),
        (lambda png: png[: len(png) // 2], "image file is truncated"),  # the pixels cut short
        (lambda png: png[:8] + b"\x00" * 40, ""),  # the signature, then nothing that is a chunk
        (lambda png: b"", "no image format Pillow reads"),
    ],
)
def test_damaged_files_stop_fit_and_predict_with_a_sentence(
    folder: Path, workdir: Path, capsys, damage: Callable[[bytes], bytes], why: str
) -> None:
    path = folder / "dog" / "005.png"
    path.write_bytes(damage(path.read_bytes()))
    for words in (
        ["fit", *tiny(folder, "--trainer.max_epochs=1")],
        ["predict", "--config", str(CONFIGS / "images.yaml"), f"--data.init_args.folder={folder}",
         f"--data.init_args.predict_path={path}", *QUIET],
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            main(words)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {str(path)!r} cannot be read as an image ({why}"), err
        assert err.count("\n") == 1, err


def test_an_image_over_pillows_limit_stops_fit_with_a_sentence(
    folder: Path, workdir: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 30)  # 8x8 = 64: over twice the limit, a bomb by its rule
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *tiny(folder, "--trainer.max_epochs=1")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {str(folder / 'cat' / '000.png')!r} has more pixels than Pillow decodes (")
    assert err.endswith("; shrink it, or raise PIL.Image.MAX_IMAGE_PIXELS if you trust the file.\n")


def released(fifo: Path, call: Callable[[], object], seconds: float = 60) -> BaseException | None:
    """What ``call`` raised (None if nothing), run in a thread; if it is still blocked on ``fifo`` after
    ``seconds``, a writer opens and closes the FIFO to release it and the test fails."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            raised.append(None)
        except BaseException as err:
            raised.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the reader sees the end of the file
        thread.join(seconds)
        pytest.fail(f"blocked on the FIFO {fifo}")
    return raised[0]


def test_a_fifo_among_the_inputs_is_refused_before_it_is_opened(folder: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    preprocessing = ImagePreprocessing([], "L", (8, 8), False, torch.zeros(1), torch.ones(1))
    expected = f"{str(fifo)!r} is a named pipe (FIFO), not an image file; name a regular file."
    calls: list[tuple[Callable[[], object], str]] = [
        (
            lambda: ImageDataModule(folder=str(folder), predict_path=str(fifo)),
            f"data.predict_path={str(fifo)!r} is a named pipe (FIFO); name a folder of images",
        ),
        (lambda: preprocessing.read(fifo, repr(str(fifo))), expected),
        (lambda: images.decode(fifo, "L", (8, 8), False), expected),
    ]
    for call, sentence in calls:
        error = released(fifo, call)
        assert isinstance(error, UserInputError), error
        assert str(error).startswith(sentence), str(error)
    # in a class folder, and listed in a CSV
    inside = folder / "owl" / "pipe.png"
    os.mkfifo(inside)
    error = released(inside, lambda: ImageDataModule(folder=str(folder)).out_features)
    owl = folder / "owl"
    assert (
        str(error)
        == f"{str(inside)!r} is a named pipe (FIFO), not an image file; remove it from {str(owl)!r}."
    )
    inside.unlink()
    pd.DataFrame({"path": ["cat/000.png", str(fifo)], "label": ["a", "b"]}).to_csv(
        folder / "l.csv", index=False
    )
    error = released(fifo, lambda: ImageDataModule(csv=str(folder / "l.csv")).out_features)
    assert str(error).startswith(
        f"data.csv={str(folder / 'l.csv')!r} row 2 names {str(fifo)!r}, which is a named pipe"
    )


@pytest.mark.parametrize(("setting", "sentence"), data_tests.REFUSED)
def test_every_shipped_datamodule_refuses_loader_and_split_settings_alike(
    setting: dict[str, Any], sentence: str
) -> None:
    """As the table's DataModule does (src/extras/tables/test_data.py)."""
    data_tests.assert_refused(ImageDataModule, setting, sentence)
