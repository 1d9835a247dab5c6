"""EarlyStopping and ModelCheckpoint on a planted val/loss, and resuming with the optimizer state intact."""

import copy
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from src.cli import CLI, callback_sections, main
from tests.conftest import CONFIGS, QUIET, plant_val_loss

TRAINER = CONFIGS / "trainer"
SPIRAL = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=300", "--data.batch_size=32",
    "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
]  # fmt: skip


def build(*args: str) -> CLI:
    return main([*SPIRAL, *args, *QUIET], run=False)


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in module.state_dict().items()}


class EpochWeights(Callback):
    """The weights at the end of each validation, when ModelCheckpoint saves them."""

    def __init__(self) -> None:
        self.per_epoch: list[dict[str, torch.Tensor]] = []

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.per_epoch.append(weights(pl_module))


def test_early_stopping_waits_patience_epochs_and_checkpoints_keep_the_best(workdir: Path) -> None:
    # best at epoch 1; later values come close (0.85 at epoch 4) but never beat it
    script = [1.0, 0.8, 0.9, 0.95, 0.85, 0.97, 0.99, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]
    run = build("--config", str(TRAINER / "checkpoints.yaml"), f"--trainer.max_epochs={len(script)}")
    plant_val_loss(run, script)
    epochs = EpochWeights()
    run.trainer.callbacks.append(epochs)
    run.trainer.fit(run.model, datamodule=run.datamodule)

    stopper, keeper = run.trainer.early_stopping_callback, run.trainer.checkpoint_callback  # the best-k one
    latest = run.trainer.checkpoint_callbacks[1]
    best_epoch = min(range(len(script)), key=script.__getitem__)
    ran = len(epochs.per_epoch)
    assert stopper.stopped_epoch == best_epoch + stopper.patience
    assert ran == best_epoch + stopper.patience + 1 < len(script)

    # the k best of the epochs that ran, by the planted value, each holding that epoch's weights
    expected_best = sorted(range(ran), key=script.__getitem__)[: keeper.save_top_k]
    files = sorted(Path(keeper.dirpath).glob("best-*.ckpt"))
    saved = {torch.load(f, weights_only=True)["epoch"]: f for f in files}
    assert sorted(saved) == sorted(expected_best)
    for epoch, path in saved.items():
        torch.testing.assert_close(torch.load(path, weights_only=True)["state_dict"], epochs.per_epoch[epoch])
    assert torch.load(keeper.best_model_path, weights_only=True)["epoch"] == best_epoch
    assert keeper.best_model_score.item() == pytest.approx(script[best_epoch])  # logged as float32
    # last.ckpt holds the state at the fit's end (its `ran` epochs done), although the last epoch made no
    # top-k checkpoint
    assert {p.name for p in Path(latest.dirpath).glob("last*")} == {"last.ckpt"}
    last = torch.load(Path(latest.dirpath) / "last.ckpt", weights_only=True)
    assert last["epoch"] == ran
    torch.testing.assert_close(last["state_dict"], weights(run.model))


class TrainingState(Callback):
    """The optimizer, scheduler and loop state when training starts (after a resume) and ends."""

    def __init__(self) -> None:
        self.at: dict[str, dict] = {}

    def _grab(self, trainer: L.Trainer, when: str) -> None:
        self.at[when] = copy.deepcopy(
            {
                "optimizer": trainer.optimizers[0].state_dict(),
                "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict(),
                "weights": weights(trainer.lightning_module),
                "epoch": trainer.current_epoch,
                "step": trainer.global_step,
            }
        )

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._grab(trainer, "start")

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._grab(trainer, "end")


# val/loss per epoch, rising: the first run stops after epoch 3, which is not among its 3 best, so a
# last.ckpt written only beside a new best one (save_last on the best-k callback) would hold epoch 2
RISING = [0.5, 0.6, 0.7, 0.8, 0.9]
STOP_AFTER = 4  # epochs of the first run


# resuming writes into the folder that holds the checkpoint it resumes from, as intended
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty:UserWarning")
def test_fit_ckpt_path_last_resumes_optimizer_and_scheduler_state(workdir: Path) -> None:
    named = "--trainer.logger.init_args.version=resumable"  # the resumed run looks in this run's folder
    states = []
    for epochs, ckpt_path in ((STOP_AFTER, None), (STOP_AFTER + 1, "last")):
        run = build("--config", str(TRAINER / "checkpoints.yaml"), named, f"--trainer.max_epochs={epochs}")
        plant_val_loss(run, RISING)
        state = TrainingState()
        run.trainer.callbacks.append(state)
        run.trainer.fit(run.model, datamodule=run.datamodule, ckpt_path=ckpt_path)
        states.append(state.at)
    stopped, resumed = states[0]["end"], states[1]["start"]
    assert resumed["optimizer"]["state"]  # Adam has moments to compare
    assert {"exp_avg", "exp_avg_sq", "step"} <= set(resumed["optimizer"]["state"][0])
    torch.testing.assert_close(resumed["optimizer"], stopped["optimizer"], rtol=0, atol=0)
    assert resumed["scheduler"] == stopped["scheduler"]
    assert resumed["scheduler"]["last_epoch"] == STOP_AFTER
    torch.testing.assert_close(resumed["weights"], stopped["weights"], rtol=0, atol=0)
    # 2 batches per epoch: it resumes where the first run stopped, not at its best epoch
    assert (resumed["epoch"], resumed["step"]) == (stopped["epoch"], stopped["step"]) == (STOP_AFTER, 8)
    assert states[1]["end"]["step"] == 10  # and it went on training


def test_checkpoints_fragment_changes_its_settings_and_keeps_every_other_callback(workdir: Path) -> None:
    """The fragment names only what it changes; every callback and every other setting stays as in
    defaults.yaml, which a fragment no longer repeats."""
    assert "class_path" not in (TRAINER / "checkpoints.yaml").read_text()
    defaults = yaml.safe_load((CONFIGS / "defaults.yaml").read_text())
    plain, stacked = build(), build("--config", str(TRAINER / "checkpoints.yaml"))
    changed = {"best_checkpoint": {"save_top_k": 3}, "early_stopping": {"patience": 5}}
    for section in callback_sections():
        shipped = defaults[section]
        assert plain.config[section].class_path == shipped["class_path"], section
        for name, value in shipped.get("init_args", {}).items():
            assert plain.config[section].init_args[name] == value, f"{section}.{name}"
        expected = plain.config[section].clone()
        for name, value in changed.get(section, {}).items():
            assert expected.init_args[name] != value, f"{section}.{name} is changed by the fragment"
            expected.init_args[name] = value
        assert stacked.config[section] == expected, section
    assert [type(c) for c in stacked.trainer.callbacks] == [type(c) for c in plain.trainer.callbacks]
    assert stacked.trainer.checkpoint_callback.save_top_k == 3  # the best-k one
    assert stacked.trainer.early_stopping_callback.patience == 5
    assert stacked.trainer.checkpoint_callbacks[1].filename == "last"  # last.ckpt, as in the defaults
