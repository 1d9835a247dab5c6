"""A regression target learnt as log(1 + y): chosen on the training rows, predicted back in the target's
units on every path of the core (the task, the predict command), carried as plain data; an app that
predicts holds its own path to the same prices in its folder."""

import functools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from src.cli import main
from src.errors import UserInputError
from src.models import Regressor
from src.models.regressor import use_log
from src.nets import MLP
from tests.conftest import CONFIGS, QUIET, fit_in

#: the table DataModule in place of the array one the shipped array configs name
TABLE_DATA = "--data=src.extras.tables.TabularDataModule"

PRICES = np.random.default_rng(0).lognormal(11, 0.8, 400)  # skewed amounts, as prices and wages are


def regressor(transform: str) -> Regressor:
    net = functools.partial(MLP, hidden_sizes=[8])
    return Regressor(in_features=3, out_features=1, net=net, target_transform=transform)


def test_auto_takes_the_log_of_skewed_amounts_only() -> None:
    assert use_log(PRICES, "auto")
    assert not use_log(np.random.default_rng(0).normal(50, 10, 400), "auto")  # symmetric
    assert not use_log(PRICES - PRICES.mean(), "auto")  # skewed, but below 0 too
    assert not use_log(PRICES, "none")
    assert use_log(np.random.default_rng(0).normal(50, 10, 400), "log")
    with pytest.raises(UserInputError, match="target_transform=log needs targets of at least 0"):
        use_log(np.array([-1.0, 2.0, 3.0]), "log")


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`:UserWarning")
def test_the_net_learns_the_standardized_log_and_predicts_in_the_targets_units() -> None:
    torch.manual_seed(0)
    model = regressor("auto")
    model.fit_target_scaling(PRICES)
    logs = np.log1p(PRICES)
    assert model.target_log.item() == 1.0
    assert model.target_mean.item() == pytest.approx(logs.mean())
    assert model.target_std.item() == pytest.approx(logs.std())
    x, y = torch.randn(12, 3), torch.as_tensor(PRICES[:12], dtype=torch.float32)
    out = model.net(x)  # (B, 1): what the net learns
    scaled = (torch.log1p(y) - model.target_mean) / model.target_std
    torch.testing.assert_close(model.training_step((x, y), 0), F.mse_loss(out.squeeze(-1), scaled))
    preds = model.predict_step((x,), 0)["preds"]
    torch.testing.assert_close(preds, torch.expm1(out.squeeze(-1) * model.target_std + model.target_mean))
    plain = regressor("none")  # as the standardized target was learnt before
    plain.fit_target_scaling(PRICES)
    assert plain.target_log.item() == 0.0
    assert plain.target_mean.item() == pytest.approx(PRICES.mean())
    torch.testing.assert_close(
        plain.predict_step((x,), 0)["preds"], plain.net(x).squeeze(-1) * plain.target_std + plain.target_mean
    )


def test_a_checkpoint_without_the_log_buffer_loads_as_learnt_without_it() -> None:
    model = regressor("log")
    state = {k: v for k, v in model.state_dict().items() if k != "target_log"}
    model.target_log.fill_(1.0)
    model.load_state_dict(state)  # strict: the missing buffer is filled in, not an error
    assert model.target_log.item() == 0.0


@pytest.fixture(scope="module")
def skewed_run(tmp_path_factory: pytest.TempPathFactory):
    return fit_skewed(tmp_path_factory.mktemp("skewed"))


def fit_skewed(folder: Path):
    """A short fit in ``folder`` of a skewed price regression; its run, last checkpoint and raw validation
    rows."""
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"size": rng.normal(100, 30, 300), "rooms": rng.integers(1, 6, 300)})
    frame["price"] = np.exp(9 + frame["size"] / 60 + 0.2 * frame["rooms"] + rng.normal(0, 0.3, 300))
    frame.to_csv(folder / "prices.csv", index=False)
    run = fit_in(
        folder, "--config", str(CONFIGS / "friedman.yaml"), TABLE_DATA, "--model=src.models.Regressor",
        "--model.init_args.net=null", "--data.source=csv", "--data.path=prices.csv",
        "--data.target_column=price", "--data.task=regression", "--model.target_transform=auto",
    )  # fmt: skip
    rows = run.datamodule.table.features.iloc[run.datamodule.split_rows["val"]]
    return run, Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt", rows


@pytest.mark.slow
def test_every_path_predicts_prices_in_their_own_units(skewed_run, tmp_path: Path) -> None:
    run, checkpoint, rows = skewed_run
    assert run.model.target_log.item() == 1.0  # auto: prices are skewed amounts
    assert torch.load(checkpoint, weights_only=True)["state_dict"]["target_log"].item() == 1.0
    x = run.datamodule.dataset("val").tensors[0]
    run.model.eval()
    with torch.no_grad():
        expected = run.model.predict_step((x,), 0)["preds"]
    assert expected.mean() > 1000  # prices, not logs
    # the predict command
    rows.to_csv(tmp_path / "rows.csv", index=False)
    words = ["--data.predict_path", str(tmp_path / "rows.csv"), "--output", str(tmp_path / "p.csv")]
    main(["predict", "--ckpt_path", str(checkpoint), *words, *QUIET])
    written = pd.read_csv(tmp_path / "p.csv")["prediction"].to_numpy()
    np.testing.assert_allclose(written, expected.numpy(), rtol=1e-5)
