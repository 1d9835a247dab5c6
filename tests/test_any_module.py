"""Your own LightningModule and your own net run as they are, and every shipped callback does its job.

``TutorialModule`` is written the way Lightning's docs and the tutorials write one: its own steps, its own
``self.log`` calls, nothing of this project. It is trained through the real CLI under every shipped
default (``configs/defaults.yaml``), and each callback is held to what it promises. ``TinyNet`` is a
plain ``nn.Module`` named in YAML as the shipped classifier's net: no subclass anywhere.
"""

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from lightning import LightningModule
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from src.cli import main
from src.models import Classifier
from src.predict import Predictor
from tests.conftest import QUIET, extra

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


class Silent(TutorialModule):
    """The same, with a validation_step that returns nothing, as many do."""

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:  # type: ignore[override]
        super().validation_step(batch, batch_idx)


class TinyNet(nn.Module):
    """A net of the user's own: the data's widths first, then its own arguments."""

    def __init__(self, inputs: int, outputs: int, width: int = 8) -> None:
        super().__init__()
        self.hidden = nn.Linear(inputs, width)
        self.out = nn.Linear(width, outputs)

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def images(run_dir: Path) -> list[str]:
    events = EventAccumulator(str(run_dir), size_guidance={"images": 0})
    events.Reload()
    return list(events.Tags()["images"])


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
    if extra("resume"):
        assert any("RandomState" in key for key in state["callbacks"])  # the generators, for an exact resume
    if extra("figures"):
        # ValidationFigures: the module returns preds and target, so the confusion matrix is drawn
        assert sorted(images(folder)) == ["summary/confusion_matrix", "val/confusion_matrix"]
    if not extra("dashboard"):
        return
    from src.extras.dashboard.logger import read_scalars

    scalars = read_scalars(folder)
    # StepValues: the loss it returned, the learning rate and the gradient norm, every 2nd optimizer step
    steps = run.trainer.global_step
    assert steps == 3 * run.trainer.num_training_batches
    assert [s for s, _ in scalars["train/optimization/loss"]] == list(range(1, steps, 2))
    assert all(value == pytest.approx(0.01) for _, value in scalars["train/optimization/lr"])
    assert len(scalars["train/optimization/grad_norm"]) == steps // 2
    # the shipped default clips at 1.0: the share of each interval's steps whose norm was above it
    assert all(0 <= share <= 1 for _, share in scalars["train/optimization/clipped"])
    # Dashboard: speed every epoch, and the gap from what the module itself logged
    assert len(scalars["train/speed/samples_per_sec"]) == 3
    gaps = [value for _, value in scalars["val/generalization_gap"]]
    val, train = [v for _, v in scalars["val/loss"]], [v for _, v in scalars["train/loss"]]
    assert gaps == pytest.approx([v - t for v, t in zip(val, train, strict=True)], rel=1e-5)


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


def test_the_guard_skips_a_plain_modules_nan_step(workdir: Path) -> None:
    NonFiniteGuard = pytest.importorskip("src.extras.guard").NonFiniteGuard
    read_scalars = pytest.importorskip("src.extras.dashboard.logger").read_scalars
    run = fit(workdir, "--model.init_args.nan_at=4", "--trainer.max_epochs=1")
    guard = next(c for c in run.trainer.callbacks if isinstance(c, NonFiniteGuard))
    assert guard.skipped == 1
    assert all(torch.isfinite(p).all() for p in run.model.parameters())
    assert run.trainer.global_step == run.trainer.num_training_batches  # the skipped step is still counted
    assert read_scalars(Path(run.trainer.logger.log_dir))["train/skipped_steps"][-1][1] == 1.0


def test_figures_say_in_one_line_what_they_need(workdir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO"):
        run = main(["fit", f"--model={__name__}.Silent", *DIGITS, "--trainer.max_epochs=1", *QUIET])
    said = [r.getMessage() for r in caplog.records if "ValidationFigures" in r.getMessage()]
    assert said == [
        "ValidationFigures draws from the {'preds', 'target'} dict validation_step returns; "
        "Silent.validation_step returns none, so no figures are drawn."
    ]
    assert images(Path(run.trainer.logger.log_dir)) == []


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
