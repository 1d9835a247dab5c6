"""Cross-validation folds and repeats: honest folds of the train and validation rows, test untouched."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from src.apps.cv import cross_validate, mean_std, repeat
from src.errors import UserInputError
from src.extras.tables import Split, TabularDataModule
from tests.conftest import BARE, CONFIGS, QUIET

TINY = [
    "--config",
    str(CONFIGS / "spiral.yaml"),
    "--data.num_samples=300",
    "--trainer.max_epochs=2",
    *BARE,
    *QUIET,
]


def fold_modules(folds: int, **kwargs) -> list[TabularDataModule]:
    return [TabularDataModule(split=Split(folds=folds, fold=k), **kwargs) for k in range(folds)]


@pytest.mark.parametrize("source", ["digits", "friedman"])
def test_folds_are_disjoint_cover_train_and_val_once_and_never_touch_test(source: str) -> None:
    plain = TabularDataModule(source=source, num_samples=500)
    train_and_val = np.concatenate([plain.split_rows["train"], plain.split_rows["val"]])
    held_out = []
    for dm in fold_modules(4, source=source, num_samples=500):
        rows = dm.split_rows
        np.testing.assert_array_equal(rows["test"], plain.split_rows["test"])
        assert not set(rows["train"].tolist()) & set(rows["val"].tolist())
        np.testing.assert_array_equal(
            np.sort(np.concatenate([rows["train"], rows["val"]])), np.sort(train_and_val)
        )
        held_out.append(rows["val"])
    # each train+val row is held out exactly once over the folds
    np.testing.assert_array_equal(np.sort(np.concatenate(held_out)), np.sort(train_and_val))


def test_classification_folds_are_stratified() -> None:
    y = TabularDataModule(source="digits").table.target.to_numpy()
    for dm in fold_modules(5, source="digits"):
        rest = np.concatenate([dm.split_rows["train"], dm.split_rows["val"]])
        overall = np.bincount(y[rest], minlength=10) / len(rest)
        for stage in ("train", "val"):
            rows = dm.split_rows[stage]
            share = np.bincount(y[rows], minlength=10) / len(rows)
            # StratifiedKFold: each class within one row of its share of the train and validation rows
            np.testing.assert_allclose(share, overall, atol=1.0 / len(rows), err_msg=stage)


def test_folds_reproduce_from_the_seed_and_change_with_it() -> None:
    first = fold_modules(3, source="spiral", num_samples=300, seed=5)
    again = fold_modules(3, source="spiral", num_samples=300, seed=5)
    other = fold_modules(3, source="spiral", num_samples=300, seed=6)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a.split_rows["val"], b.split_rows["val"])
    assert not np.array_equal(first[0].split_rows["val"], other[0].split_rows["val"])


def test_each_folds_preprocessing_and_class_weights_are_fitted_on_its_own_training_rows() -> None:
    means = []
    for dm in fold_modules(3, source="friedman", num_samples=300):
        train = dm.split_rows["train"]
        train_mean = dm.table.features.iloc[train].to_numpy(np.float64).mean(0)
        fitted = np.array([c.mean for c in dm.preprocessor.numeric])
        np.testing.assert_allclose(fitted, train_mean, rtol=1e-6)
        # and not on all train+val rows: the held-out fold moves the mean
        everything = np.concatenate([train, dm.split_rows["val"]])
        assert not np.allclose(fitted, dm.table.features.iloc[everything].to_numpy(np.float64).mean(0))
        assert dm.train_targets().mean() == pytest.approx(dm.table.target.iloc[train].mean())
        means.append(fitted)
    assert not np.allclose(means[0], means[1])
    dm = TabularDataModule(source="digits", split=Split(folds=3, fold=1))
    counts = np.bincount(dm.train_targets(), minlength=10)
    np.testing.assert_allclose(dm.class_weights().numpy(), len(dm.train_targets()) / (10 * counts), rtol=1e-6)


@pytest.mark.parametrize(("folds", "fold"), [(1, 0), (3, 3), (3, -1)])
def test_a_fold_that_does_not_exist_is_refused(folds: int, fold: int) -> None:
    with pytest.raises(UserInputError, match=r"data\.split\.folds"):
        TabularDataModule(split=Split(folds=folds, fold=fold))


def test_cross_validate_trains_one_run_per_fold_and_reports_mean_and_std(workdir: Path, capsys) -> None:
    seen: list[int] = []
    results = cross_validate(TINY, folds=3, group="cv", after_fold=lambda k, _: seen.append(k))
    assert seen == [0, 1, 2]
    assert [set(r) >= {"val/loss", "val/acc"} for r in results] == [True] * 3
    assert "test/acc" not in results[0]
    folder = workdir / "logs" / "spiral" / "cv"
    for k in range(3):
        run_config = yaml.safe_load((folder / f"fold{k}" / "config.yaml").read_text())
        assert (
            run_config["data"]["init_args"]["split"]["folds"],
            run_config["data"]["init_args"]["split"]["fold"],
        ) == (3, k)
    summary = yaml.safe_load((folder / "summary.yaml").read_text())
    accs = [r["val/acc"] for r in results]
    assert [summary["val/acc"][f"fold{k}"] for k in range(3)] == pytest.approx(accs)
    assert summary["val/acc"]["mean"] == pytest.approx(np.mean(accs))
    assert summary["val/acc"]["std"] == pytest.approx(np.std(accs, ddof=1))
    assert len(set(accs)) > 1  # three different held-out folds, three different models
    out = capsys.readouterr().out
    assert f"{np.mean(accs):.4f} ± {np.std(accs, ddof=1):.4f}" in out
    assert list(folder.glob("events.out.tfevents.*"))


def test_repeat_varies_the_seed_and_reports_test_metrics(workdir: Path, capsys) -> None:
    results = repeat(TINY, seeds=2, group="seeds")
    assert all({"test/loss", "test/acc"} <= set(r) for r in results)
    assert results[0]["test/acc"] != results[1]["test/acc"]
    for seed in range(2):
        run_config = yaml.safe_load(
            (workdir / "logs" / "spiral" / "seeds" / f"seed{seed}" / "config.yaml").read_text()
        )
        assert (run_config["seed_everything"], run_config["data"]["init_args"]["seed"]) == (seed, seed)
    assert "test/acc" in capsys.readouterr().out


def test_mean_std_is_the_sample_standard_deviation() -> None:
    assert mean_std([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
    assert mean_std([0.5]) == (0.5, 0.0)
