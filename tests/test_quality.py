"""The shipped experiments reach their promised quality against scikit-learn baselines on the same split.

Full training runs (about a minute together), so they are ``slow``: ``make test-full`` runs them.
"""

import numpy as np
import pytest
from sklearn.linear_model import RidgeCV
from sklearn.metrics import r2_score

pytestmark = pytest.mark.slow

QUIET = ["--test_after_fit=true"]


def split(datamodule, stage: str) -> tuple[np.ndarray, np.ndarray]:
    """The encoded features and targets of one split, exactly as the net saw them."""
    x, y = datamodule.dataset(stage).tensors
    return x.numpy(), y.numpy()


def test_digits_reaches_97_percent(cli) -> None:
    run = cli("fit", "--config", "digits.yaml", *QUIET)
    assert run.trainer.callback_metrics["test/acc"].item() >= 0.97


def test_diabetes_beats_ridge_on_the_same_split(cli) -> None:
    run = cli("fit", "--config", "diabetes.yaml", *QUIET)
    (x_train, y_train), (x_test, y_test) = (split(run.datamodule, s) for s in ("train", "test"))
    ridge = RidgeCV(alphas=[0.01, 0.1, 1.0, 10.0, 100.0]).fit(x_train, y_train)
    ridge_r2 = r2_score(y_test, ridge.predict(x_test))
    assert run.trainer.callback_metrics["test/r2"].item() >= ridge_r2


def test_friedman_reaches_r2_of_0_9(cli) -> None:
    run = cli("fit", "--config", "friedman.yaml", *QUIET)
    assert run.trainer.callback_metrics["test/r2"].item() >= 0.9
