"""Your own LightningModule and your own net run as they are, under every shipped default.

``TutorialModule`` is written the way Lightning's docs and the tutorials write one: its own steps, its own
``self.log`` calls, nothing of this project. It is trained through the real CLI under every shipped
default (``configs/defaults.yaml``), and the core's checkpoints are held to what they promise; each
plug-in's folder holds what its callback promises such a module (they import :class:`TutorialModule` and
:func:`fit` from here). ``TinyNet`` is a plain ``nn.Module`` named in YAML as the shipped classifier's
net: no subclass anywhere.
"""

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from lightning import LightningModule
from torch import nn
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from src.cli import main
from src.models import Classifier
from src.predict import Predictor
from tests.conftest import QUIET

#: a small fit of the bundled digits: 3 epochs of 5 batches, validation and checkpoints every epoch
DIGITS = [
    "--data.source=digits",
    "--data.batch_size=256",
    "--trainer.max_epochs=3",
    "--trainer.log_every_n_steps=2",
]


class TutorialModule(LightningModule):
    """A LightningModule of the user's own, as the tutorials write it."""

    def __init__(
        self, in_features: int, out_features: int, hidden: int = 32, lr: float = 0.01, nan_at: int = -1
    ):
        super().__init__()
        self.save_hyperparameters()
        self.layers = nn.Sequential(
            nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features)
        )
        self.val_acc = MulticlassAccuracy(out_features)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        if self.global_step == self.hparams["nan_at"]:
            loss = loss * torch.tensor(float("nan"))  # one bad batch
        self.log("train/loss", loss, on_step=False, on_epoch=True)
        return loss

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = batch
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits, y))
        self.val_acc.update(logits, y)
        self.log("val/acc", self.val_acc)
        return {"preds": logits, "target": y}

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams["lr"])


class TinyNet(nn.Module):
    """A net of the user's own: the data's widths first, then its own arguments."""

    def __init__(self, inputs: int, outputs: int, width: int = 8) -> None:
        super().__init__()
        self.hidden = nn.Linear(inputs, width)
        self.out = nn.Linear(width, outputs)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def fit(workdir: Path, *words: str) -> Any:
    return main(["fit", f"--model={__name__}.TutorialModule", *DIGITS, *words, *QUIET])


def test_a_plain_lightning_module_trains_under_every_shipped_default(workdir: Path) -> None:
    run = fit(workdir)
    model = run.model
    assert type(model) is TutorialModule
    # the data's widths reached its constructor: nobody typed 64 or 10
    assert (model.hparams["in_features"], model.hparams["out_features"]) == (64, 10)
    folder = Path(run.trainer.logger.log_dir)
    # both checkpoints, whole, carrying the run's own config
    best = run.trainer.checkpoint_callback.best_model_path
    last = folder / "checkpoints" / "last.ckpt"
    assert Path(best).is_file()
    assert last.is_file()
    state = torch.load(last, weights_only=True)
    assert state["config"]["model"]["class_path"] == f"{__name__}.TutorialModule"
    # three epochs of five batches, and last.ckpt written at the fit's end holds them all
    assert run.trainer.global_step == state["global_step"] == 3 * run.trainer.num_training_batches


@pytest.mark.slow
def test_resuming_a_plain_module_continues_exactly(workdir: Path) -> None:
    whole = fit(workdir, "--trainer.logger.init_args.name=whole")
    cut = fit(workdir, "--trainer.logger.init_args.name=cut", "--trainer.max_epochs=2")
    last = Path(cut.trainer.logger.log_dir) / "checkpoints" / "last.ckpt"
    resumed = fit(workdir, "--trainer.logger.init_args.name=cut", f"--ckpt_path={last}")
    assert resumed.trainer.current_epoch == whole.trainer.current_epoch == 3
    for (name, a), (_, b) in zip(
        whole.model.state_dict().items(), resumed.model.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_a_net_of_your_own_is_a_config_change(workdir: Path) -> None:
    config = workdir / "mine.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "class_path": "src.models.Classifier",
                    "init_args": {"net": {"class_path": f"{__name__}.TinyNet", "init_args": {"width": 16}}},
                },
                "data": {"source": "digits", "batch_size": 256},
                "trainer": {"max_epochs": 2},
            }
        )
    )
    run = main(["fit", "--config", str(config), *QUIET])
    assert type(run.model) is Classifier
    assert type(run.model.net) is TinyNet
    assert (
        run.model.net.hidden.in_features,
        run.model.net.hidden.out_features,
        run.model.net.out.out_features,
    ) == (
        64,
        16,
        10,
    )
    last = Path(run.trainer.logger.log_dir) / "checkpoints" / "last.ckpt"
    # the checkpoint alone rebuilds the net, from the config it carries
    predictor = Predictor.from_checkpoint(last)
    assert type(predictor.model.net) is TinyNet
    for a, b in zip(predictor.model.state_dict().values(), run.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b.cpu(), rtol=0, atol=0)
    # and the CLI predicts from it (the validation rows, by default), the user's config naming the net
    out = workdir / "predictions.csv"
    main(["predict", "--config", str(config), f"--ckpt_path={last}", f"--output={out}", *QUIET])
    written = pd.read_csv(out)
    expected = predictor.predict(run.datamodule.predict_frame)
    assert list(written.columns) == list(expected.columns)
    pd.testing.assert_frame_equal(written, expected.reset_index(drop=True), check_dtype=False, atol=1e-6)
