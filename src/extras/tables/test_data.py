"""The DataModule: honest splits, scaling fitted on train only, index-batched loaders."""

import re
from typing import Any
from unittest import mock

import numpy as np
import pandas as pd
import pytest
import torch

from src.data import TensorBatches
from src.errors import UserInputError
from src.extras.tables import Split, TabularDataModule, sources


def make(**kwargs) -> TabularDataModule:
    dm = TabularDataModule(**kwargs)
    dm.setup("fit")
    return dm


@pytest.mark.parametrize("source", ["digits", "diabetes", "spiral", "friedman"])
def test_splits_are_disjoint_complete_and_sized(source: str) -> None:
    dm = TabularDataModule(source=source, num_samples=600, split=Split(val_fraction=0.15, test_fraction=0.25))
    rows = dm.split_rows
    train, val, test = (set(rows[s].tolist()) for s in ("train", "val", "test"))
    assert not (train & val)
    assert not (train & test)
    assert not (val & test)
    n = len(dm.table.target)
    assert train | val | test == set(range(n))
    assert len(test) == pytest.approx(0.25 * n, abs=1)
    assert len(val) == pytest.approx(0.15 * n, abs=1)


def test_splits_reproduce_from_the_seed_and_change_with_it() -> None:
    first, again = TabularDataModule(seed=7).split_rows, TabularDataModule(seed=7).split_rows
    other = TabularDataModule(seed=8).split_rows
    for stage in ("train", "val", "test"):
        np.testing.assert_array_equal(first[stage], again[stage])
    assert not np.array_equal(first["test"], other["test"])


def test_classification_splits_are_stratified() -> None:
    dm = TabularDataModule(source="digits", split=Split(val_fraction=0.1, test_fraction=0.2))
    y = dm.table.target
    overall = np.bincount(y) / len(y)
    for stage, rows in dm.split_rows.items():
        share = np.bincount(y[rows], minlength=10) / len(rows)
        # stratified: every class within 1.5 rows of its overall share in every split
        np.testing.assert_allclose(share, overall, atol=1.5 / len(rows), err_msg=stage)


def test_scaling_statistics_come_from_the_training_split_only() -> None:
    dm = make(source="friedman", num_samples=400)
    train_rows = dm.split_rows["train"]
    train_mean = dm.table.features.iloc[train_rows].to_numpy(np.float64).mean(0)
    np.testing.assert_allclose([c.mean for c in dm.preprocessor.numeric], train_mean, rtol=1e-6)
    x_train = dm.dataset("train").tensors[0]
    torch.testing.assert_close(x_train.mean(0), torch.zeros(10), atol=1e-5, rtol=0)

    # perturb every val/test row wildly: the fitted numbers and the training tensors must not move
    perturbed = TabularDataModule(source="friedman", num_samples=400)
    features = perturbed.table.features.copy()
    held_out = np.concatenate([perturbed.split_rows["val"], perturbed.split_rows["test"]])
    features.iloc[held_out] = features.iloc[held_out] * 100 + 50
    object.__setattr__(perturbed.table, "features", features)
    assert perturbed.preprocessor == dm.preprocessor
    torch.testing.assert_close(perturbed.dataset("train").tensors[0], x_train)
    assert not torch.allclose(perturbed.dataset("test").tensors[0], dm.dataset("test").tensors[0])


def test_class_weights_and_training_targets_come_from_the_training_split() -> None:
    dm = make(source="digits")
    y_train = dm.table.target.to_numpy()[dm.split_rows["train"]]
    counts = np.bincount(y_train, minlength=10)
    torch.testing.assert_close(
        dm.class_weights(), torch.tensor(len(y_train) / (10 * counts), dtype=torch.float32)
    )
    reg = make(source="diabetes")
    y = reg.table.target.to_numpy(np.float64)[reg.split_rows["train"]]
    assert reg.train_targets().astype(np.float64) == pytest.approx(y)  # what the regressor's scaling reads


def test_loader_batches_by_indexing_not_per_sample() -> None:
    dm = make(source="spiral", num_samples=300, batch_size=32, min_batches_per_epoch=None)
    with mock.patch.object(TensorBatches, "__getitem__", side_effect=AssertionError("per-sample path")):
        batches = list(dm.train_dataloader())
    x, y = batches[0]
    assert x.shape == (32, 2)
    assert y.shape == (32,)
    assert y.dtype == torch.int64
    assert sum(len(b[1]) for b in batches) == len(dm.split_rows["train"])


def test_training_shuffle_is_seeded_and_fresh_each_epoch() -> None:
    def epoch_orders(seed: int) -> list[torch.Tensor]:
        dm = make(source="spiral", num_samples=300, batch_size=16, seed=seed)
        loader = dm.train_dataloader()
        return [torch.cat([y for _, y in loader]), torch.cat([x[:, 0] for x, _ in loader])]

    a, b = epoch_orders(3), epoch_orders(3)
    torch.testing.assert_close(a, b)
    assert not torch.equal(a[1], epoch_orders(4)[1])
    # two epochs from one loader differ (the generator advances), and eval loaders keep file order
    dm = make(source="spiral", num_samples=300, batch_size=16)
    loader = dm.train_dataloader()
    first, second = (torch.cat([x[:, 0] for x, _ in loader]) for _ in range(2))
    assert not torch.equal(first, second)
    val = torch.cat([x for x, _ in dm.val_dataloader()])
    torch.testing.assert_close(val, dm.dataset("val").tensors[0])


def test_loader_options() -> None:
    dm = make(source="spiral", num_samples=300, batch_size=50, drop_last=True, num_workers=1)
    loader = dm.train_dataloader()
    assert loader.drop_last
    assert loader.persistent_workers
    assert not loader.pin_memory
    assert not dm.val_dataloader().drop_last  # evaluation sees every row
    assert not make(source="spiral", num_samples=300).train_dataloader().persistent_workers


def test_shapes_for_the_model() -> None:
    assert (
        TabularDataModule(source="digits").in_features,
        TabularDataModule(source="digits").out_features,
    ) == (64, 10)
    assert TabularDataModule(source="diabetes").out_features == 1
    assert TabularDataModule(source="spiral").in_features == 2


def test_synthetic_sources_are_seeded_and_sized() -> None:
    a, b = sources.spiral(300, 0.2, seed=1), sources.spiral(300, 0.2, seed=1)
    pd.testing.assert_frame_equal(a.features, b.features)
    assert a.features.shape == (300, 2)
    assert set(np.unique(a.target)) == {0, 1, 2}
    f = sources.friedman(500, 1.0, seed=0)
    assert f.features.shape == (500, 10)
    assert f.target.dtype == np.float32


def test_csv_source_reads_features_and_target(write_csv) -> None:
    path = write_csv({"a": [1.0, 2.0, 3.0], "b": [0.5, 0.1, 0.2], "label": [0, 2, 1]})
    location = sources.file_location(path, "csv")
    table = sources.select(sources.read_file(path, "csv"), "label", "classification", location)
    np.testing.assert_array_equal(table.features.to_numpy(), [[1, 0.5], [2, 0.1], [3, 0.2]])
    np.testing.assert_array_equal(table.target, [0, 2, 1])
    only_a = sources.select(sources.read_file(path, "csv"), "label", "regression", location, ["a"])
    assert list(only_a.features.columns) == ["a"]
    assert only_a.target.dtype == np.float32


#: loader and split settings every shipped DataModule refuses alike, and its sentence ({} the split's group:
#: ``data.`` for a DataModule whose split settings are its own arguments)
REFUSED = [
    ({"batch_size": 0}, "data.batch_size=0 must be at least 1."),
    ({"num_workers": -1}, "data.num_workers=-1 must be 0 (load in this process) or more."),
    ({"val_fraction": 0.5, "test_fraction": 0.5}, "val_fraction=0.5 and {}test_fraction=0.5 do"),
]


def assert_refused(module: type, setting: dict[str, Any], sentence: str, key: str = "data.") -> None:
    """``module(**setting)`` is refused with ``sentence``, its split settings under ``key``."""
    sentence = (key + sentence.format(key)) if "{}" in sentence else sentence
    with pytest.raises(UserInputError, match=re.escape(sentence)):
        module(**setting)


@pytest.mark.parametrize(("setting", "sentence"), REFUSED)
def test_every_shipped_datamodule_refuses_loader_and_split_settings_alike(
    setting: dict[str, Any], sentence: str
) -> None:
    """The table's DataModule; each plug-in's DataModule is held to the same sentences in its folder."""
    # the table's split settings are a group of their own: data.split.val_fraction
    if "val_fraction" in setting:
        setting = {"split": dict(setting)}  # a mapping, as a config gives it
    assert_refused(TabularDataModule, setting, sentence, key="data.split.")


def test_a_config_of_ones_own_file_switches_from_the_arrays_without_inheriting_their_source(
    workdir: Any,
) -> None:
    """configs/defaults.yaml names the core's arrays; a config that names the table DataModule keeps
    what both take (jsonargparse's rule on a class switch), so the arrays' source must not be one the
    table would read instead of its file (the README's penguins config, as written)."""
    from src.cli import main

    pd.DataFrame({"a": np.arange(40.0), "label": [0, 1] * 20}).to_csv("mine.csv", index=False)
    with open("mine.yaml", "w") as config:
        config.write(
            "data:\n  class_path: src.extras.tables.TabularDataModule\n"
            "  init_args: {path: mine.csv, target_column: label, task: classification}\n"
        )
    run = main(["--model=src.models.Classifier", "--config", "mine.yaml"], run=False)
    assert run.datamodule.source == "csv"
    assert run.datamodule.table.features.columns.tolist() == ["a"]
