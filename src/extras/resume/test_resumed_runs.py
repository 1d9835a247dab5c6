"""The core's own runs, resumed with this extra on: a LightningModule of the user's own (``TutorialModule``
of tests/test_any_module.py, which knows nothing of this project) and two DDP processes (the helpers of
tests/test_distributed.py)."""

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from typing_extensions import override

from src.extras.resume import Resume
from tests.test_any_module import fit as fit_plain
from tests.test_distributed import TRAINER, B, RankReport, build


def test_a_plain_lightning_module_trains_under_every_shipped_default(workdir: Path) -> None:
    run = fit_plain(workdir)
    state = torch.load(Path(run.trainer.logger.log_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    assert any("RandomState" in key for key in state["callbacks"])  # the generators, for an exact resume


class StopAfter(Callback):
    """Stops the fit after the given optimizer step on every process, as a preemption would."""

    def __init__(self, step: int) -> None:
        self.step = step

    @override
    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


def test_ddp_resumed_equals_uninterrupted(workdir: Path) -> None:
    """Two processes, dropout and DistributedSampler shuffling on: stopped after epoch 0 and resumed from
    last.ckpt, the replicas end bit for bit where the uninterrupted run's do."""

    def fit(report: Path, *callbacks: Callback, ckpt_path: str | None = None) -> None:
        run = build(
            "--config", str(TRAINER / "ddp.yaml"), "--trainer.strategy=ddp_fork", f"--data.batch_size={B}",
            "--model.init_args.net.init_args.dropout=0.2", "--trainer.max_epochs=3",
        )  # fmt: skip
        report.mkdir()
        saver = ModelCheckpoint(dirpath=report / "checkpoints", filename="last", enable_version_counter=False)
        # Resume: the generators' states, which dropout and the sampler's shuffling draw from
        run.trainer.callbacks.extend([RankReport(report), saver, Resume(), *callbacks])
        run.trainer.fit(run.model, datamodule=run.datamodule, ckpt_path=ckpt_path)

    fit(workdir / "uninterrupted")
    fit(workdir / "first", StopAfter(7))  # 7 steps per epoch: stops at the end of epoch 0
    last = workdir / "first" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 7
    fit(workdir / "resumed", ckpt_path=str(last))
    for rank in range(2):
        resumed = torch.load(workdir / "resumed" / f"rank{rank}.pt", weights_only=True)
        uninterrupted = torch.load(workdir / "uninterrupted" / f"rank{rank}.pt", weights_only=True)
        assert resumed["global_step"] == uninterrupted["global_step"] == 21
        torch.testing.assert_close(resumed["weights"], uninterrupted["weights"], rtol=0, atol=0)
