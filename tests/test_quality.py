"""The shipped experiments reach their promised quality against scikit-learn baselines on the same split.

Full training runs (about a minute together), so they are ``slow``: ``make test-full`` runs them.
"""

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression, RidgeCV
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


def test_penguins_match_scikit_learn_on_the_same_split(cli) -> None:
    """The messy real table: within two test rows of the better of two scikit-learn baselines trained on
    the same encoded train+val rows (logistic regression, gradient-boosted trees)."""
    run = cli("fit", "--config", "penguins.yaml", *QUIET)
    (x_train, y_train), (x_val, y_val), (x_test, y_test) = (
        split(run.datamodule, s) for s in ("train", "val", "test")
    )
    x_fit, y_fit = np.concatenate([x_train, x_val]), np.concatenate([y_train, y_val])
    baselines = [
        LogisticRegression(max_iter=2000).fit(x_fit, y_fit).score(x_test, y_test),
        HistGradientBoostingClassifier(random_state=0).fit(x_fit, y_fit).score(x_test, y_test),
    ]
    assert run.trainer.callback_metrics["test/acc"].item() >= max(baselines) - 2 / len(y_test)
