"""``--test_after_fit`` tests the weights of the best checkpoint, not the weights the fit ended with.

The validation losses are planted so that the best epoch is not the last one: the two candidates then
hold different weights, and the test loop's own weights tell which one it ran with.
"""

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from src.cli import CLI
from tests.conftest import plant_val_loss

# val/loss per epoch: the best at epoch 1 of 3, so the fit ends one epoch after its best. The planted
# loss answers for every evaluation, so the test after fit (current_epoch 3 by then) reads the last entry.
SCRIPT = [1.0, 0.5, 0.9, 0.7]
BEST_EPOCH, LAST_EPOCH = 1, 2


class WeightsUnderTest(Callback):
    """The weights the test loop runs with: by ``on_test_start`` Lightning has loaded its checkpoint."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] | None = None

    @override
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.weights = {name: t.detach().clone() for name, t in pl_module.state_dict().items()}


def test_after_fit_runs_the_best_checkpoints_weights_not_the_last(
    cli, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tested = WeightsUnderTest()
    own_before_fit = getattr(CLI, "before_fit", None)

    def before_fit(self: CLI) -> None:
        # LightningCLI's hook between building the model and trainer and calling fit
        if own_before_fit is not None:
            own_before_fit(self)
        plant_val_loss(self, SCRIPT)
        self.trainer.callbacks.append(tested)

    monkeypatch.setattr(CLI, "before_fit", before_fit, raising=False)
    run = cli(
        "fit", "--config", "spiral.yaml", "--data.num_samples=300", "--data.batch_size=32",
        f"--trainer.max_epochs={LAST_EPOCH + 1}", "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1", "--test_after_fit=true",
    )  # fmt: skip

    best_path = run.trainer.checkpoint_callback.best_model_path
    best = torch.load(best_path, weights_only=True)
    last = torch.load(Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    # the precondition: the planted losses made an earlier epoch the best, and training went on after it
    assert (best["epoch"], last["epoch"]) == (BEST_EPOCH, LAST_EPOCH + 1)  # last.ckpt: at the fit's end
    assert not torch.equal(best["state_dict"]["net.head.weight"], last["state_dict"]["net.head.weight"])

    assert f"Testing the best checkpoint: {best_path}" in capsys.readouterr().out
    assert tested.weights is not None
    assert "test/acc" in run.trainer.callback_metrics
    # what was printed is what was tested: the best checkpoint's weights, bit for bit, not last.ckpt's
    torch.testing.assert_close(tested.weights, best["state_dict"], rtol=0, atol=0)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(tested.weights, last["state_dict"])
