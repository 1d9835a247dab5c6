"""The shipped table experiment reaches its promised quality against scikit-learn baselines on the same
split (the core's: tests/test_quality.py). A full training run, so it is ``slow``."""

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression

from tests.test_quality import QUIET, split

pytestmark = pytest.mark.slow


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
