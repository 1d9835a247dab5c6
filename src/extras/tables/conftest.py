"""Table runs shared by the table kind's tests and by the apps' tests of a table checkpoint (export, serve,
cv), which import these fixtures (``from src.extras.tables.conftest import messy_trained``)."""

from pathlib import Path

import pytest

from tests.conftest import CONFIGS, Trained, fit_in

#: the table DataModule in place of the array one the shipped array configs name
TABLE_DATA = "--data=src.extras.tables.TabularDataModule"


@pytest.fixture(scope="session")
def messy_trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """One short fit on a messy CSV (text, yes/no words, booleans, empty cells, "?", named classes),
    shared by the tests of what comes after training a table, here and in the folders of the apps that
    take a table checkpoint further. No net named: the default one (src.nets.DEFAULT_NET) is what they
    take."""
    from src.extras.tables.test_preprocessing import messy_frame

    folder = tmp_path_factory.mktemp("messy-trained")
    frame = messy_frame(n=300)
    frame.to_csv(folder / "train.csv", index=False)
    run = fit_in(
        folder, "--config", str(CONFIGS / "digits.yaml"), TABLE_DATA,
        "--data.source=csv", "--data.path=train.csv",
        "--data.target_column=label", "--data.task=classification", "--data.encoding.max_categories=4",
        "--data.encoding.missing_indicator=true", "--model.init_args.net=null",
    )  # fmt: skip
    return Trained(run, frame, Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt")


@pytest.fixture(scope="session")
def target_trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The messy fit of ``messy_trained`` with its columns of more than 4 values (region, city) read by
    their target means (``data.encoding.high_cardinality: target``)."""
    from src.extras.tables.test_preprocessing import messy_frame

    folder = tmp_path_factory.mktemp("target-trained")
    frame = messy_frame(n=300)
    frame.to_csv(folder / "train.csv", index=False)
    run = fit_in(
        folder, "--config", str(CONFIGS / "digits.yaml"), TABLE_DATA, "--data.source=csv",
        "--data.path=train.csv",
        "--data.target_column=label", "--data.task=classification", "--data.encoding.max_categories=4",
        "--data.encoding.missing_indicator=true", "--model.init_args.net=null",
        "--data.encoding.high_cardinality=target",
    )  # fmt: skip
    assert [c.name for c in run.datamodule.preprocessor.categorical if c.encodings is not None] == [
        "region", "city"
    ]  # fmt: skip
    return Trained(run, frame, Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt")
