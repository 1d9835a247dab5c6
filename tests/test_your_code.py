"""Your code takes effect everywhere, and is yours once: an edit to the shipped classifier's
``predict_step`` answers on every path that predicts, and a net or LightningModule in a file of yours
outside ``src/`` (this one) trains, then validates, tests and predicts from its checkpoint alone."""

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from lightning import LightningModule
from torch import nn
from typing_extensions import override

from src.cli import CLI, main
from src.models import Classifier
from src.predict import Predictor
from tests.conftest import CONFIGS, CORE_ONLY, ONE_PASS, PLANTED, QUIET

SPIRAL = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=300", *ONE_PASS,
    "--trainer.max_epochs=2", *CORE_ONLY,
]  # fmt: skip
TEMPERATURE = 3.0


class Tempered(Classifier):
    """The shipped classifier as a user edits it: its probabilities softened by a temperature."""

    @override
    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        probs = (self(batch[0]) / TEMPERATURE).softmax(dim=-1)
        return {"probs": probs, "preds": probs.argmax(dim=-1)}


class Thresholded(Classifier):
    """The shipped classifier with the decision a user writes: the first class unless another is all but
    certain."""

    @override
    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        probs = self(batch[0]).softmax(dim=-1)
        top = probs.max(dim=-1)
        return {"probs": probs, "preds": torch.where(top.values > SURE, top.indices, 0)}


SURE = 0.99


class YourNet(nn.Module):
    """A net of your own: the data's widths first, then its own arguments."""

    def __init__(self, inputs: int, outputs: int, width: int = 16) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(inputs, width), nn.Tanh(), nn.Linear(width, outputs))

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class YourModule(LightningModule):
    """A LightningModule of your own, as the tutorials write one, with a predict_step of its own."""

    def __init__(self, in_features: int, out_features: int, width: int = 16, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = YourNet(in_features, out_features, width)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss, on_step=False, on_epoch=True)
        return loss

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", F.cross_entropy(self(x), y))

    @override
    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test/loss", F.cross_entropy(self(x), y))

    @override
    def predict_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        probs = self(batch[0]).softmax(dim=-1)
        return {"probs": probs, "preds": probs.argmax(dim=-1)}

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams["lr"])


def fitted(*words: str) -> tuple[CLI, Path]:
    run = main(["fit", *SPIRAL, *words, *QUIET])
    return run, Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt"


@pytest.fixture
def rows(workdir: Path) -> tuple[pd.DataFrame, Path]:
    """Rows to predict, as a file: the first 40 of the spiral's validation split."""
    run = main([*SPIRAL, *QUIET], run=False)
    frame = run.datamodule.predict_frame.iloc[:40]  # the validation rows' feature columns
    frame.to_csv(workdir / "rows.csv", index=False)
    return frame.reset_index(drop=True), workdir / "rows.csv"


def test_an_edit_to_predict_step_answers_on_every_path(
    workdir: Path, rows: tuple[pd.DataFrame, Path]
) -> None:
    frame, file = rows
    _, ckpt = fitted(f"--model={__name__}.Tempered")
    predict = ["predict", f"--ckpt_path={ckpt}", f"--data.predict_path={file}"]
    main([*predict, "--output=trainer.csv", *QUIET])  # the Trainer's predict
    predictor = Predictor.from_checkpoint(ckpt)
    assert type(predictor.model) is Tempered  # found from the checkpoint alone
    written = pd.read_csv(workdir / "trainer.csv")
    pd.testing.assert_frame_equal(written, predictor.predict(frame), check_dtype=False, atol=1e-6)
    # the edit took effect: the probabilities are the tempered ones, not the plain softmax
    with torch.no_grad():
        logits = predictor.graph(predictor.read(frame))  # the run's standardization, then the model
    probs = written.filter(like="probability(").to_numpy()
    torch.testing.assert_close(
        torch.from_numpy(probs).float(), (logits / TEMPERATURE).softmax(-1), atol=1e-6, rtol=0
    )
    assert not torch.allclose(torch.from_numpy(probs).float(), logits.softmax(-1), atol=1e-3)


def test_an_edit_to_the_decision_names_the_class_on_every_path(
    workdir: Path, rows: tuple[pd.DataFrame, Path]
) -> None:
    frame, file = rows
    _, ckpt = fitted(f"--model={__name__}.Thresholded")
    predict = ["predict", f"--ckpt_path={ckpt}", f"--data.predict_path={file}"]
    main([*predict, "--output=trainer.csv", *QUIET])
    written = pd.read_csv(workdir / "trainer.csv")
    predictor = Predictor.from_checkpoint(ckpt)
    pd.testing.assert_frame_equal(written, predictor.predict(frame), check_dtype=False, atol=1e-6)
    probs = written.filter(like="probability(").to_numpy()
    labels = [str(label) for label in predictor.labels]
    chosen = np.where(probs.max(axis=1) > SURE, probs.argmax(axis=1), 0)
    assert written["prediction"].astype(str).tolist() == [labels[k] for k in chosen]
    assert (chosen != probs.argmax(axis=1)).any()  # rows where the edit and the likeliest class differ


def test_your_module_validates_tests_and_predicts_from_its_checkpoint_alone(
    workdir: Path, rows: tuple[pd.DataFrame, Path]
) -> None:
    frame, file = rows
    fit, ckpt = fitted(f"--model={__name__}.YourModule", "--model.init_args.width=8")
    validated = main(["validate", f"--ckpt_path={ckpt}", *QUIET])
    assert type(validated.model) is YourModule
    assert validated.model.hparams["width"] == 8  # the checkpoint's settings, not the defaults
    torch.testing.assert_close(
        validated.trainer.callback_metrics["val/loss"], fit.trainer.callback_metrics["val/loss"]
    )
    tested = main(["test", f"--ckpt_path={ckpt}", *QUIET])
    assert torch.isfinite(tested.trainer.callback_metrics["test/loss"])
    main(["predict", f"--ckpt_path={ckpt}", f"--data.predict_path={file}", "--output=out.csv", *QUIET])
    expected = Predictor.from_checkpoint(ckpt).predict(frame)
    pd.testing.assert_frame_equal(pd.read_csv(workdir / "out.csv"), expected, check_dtype=False, atol=1e-6)
    # given again with --model, the checkpoint still supplies the data and the module's settings
    again = main(["validate", f"--model={__name__}.YourModule", f"--ckpt_path={ckpt}", *QUIET])
    assert again.model.hparams["width"] == 8
    assert again.datamodule.hparams["num_samples"] == 300


def test_your_net_in_the_shipped_classifier_predicts_from_its_checkpoint_alone(
    workdir: Path, rows: tuple[pd.DataFrame, Path]
) -> None:
    frame, file = rows
    _, ckpt = fitted(f"--model.init_args.net={__name__}.YourNet", "--model.init_args.net.init_args.width=4")
    predictor = Predictor.from_checkpoint(ckpt)
    assert type(predictor.model.net) is YourNet
    assert predictor.model.net.layers[0].out_features == 4
    main(["predict", f"--ckpt_path={ckpt}", f"--data.predict_path={file}", "--output=out.csv", *QUIET])
    pd.testing.assert_frame_equal(
        pd.read_csv(workdir / "out.csv"), predictor.predict(frame), check_dtype=False, atol=1e-6
    )


def test_the_projects_own_files_are_trusted_and_nothing_installed_is(planted: Path) -> None:
    from src.checkpoints import in_project

    assert in_project(f"{__name__}.YourModule")  # a file of yours beside src/
    assert in_project("src.models.Classifier")
    # installed packages are not the project's, even in an environment inside its folder (.venv)
    assert not in_project("pandas.DataFrame")
    assert not in_project("torch.nn.Linear")
    assert not in_project("os.system")
    # nor is a module elsewhere on the import path (here, the scratch folder of the planted module)
    assert not in_project(f"{PLANTED}.Optimizer")
    assert not planted.exists()  # nothing was imported to find out
