"""Run by tests/test_distributed.py under ``torchrun --nproc_per_node=2``: fit with FSDP2, resume, report.

    torchrun --nproc_per_node=2 tests/torchrun_fsdp.py OUT_FOLDER [CLI words...]

Each rank writes ``OUT_FOLDER/rank<N>.pt``: its local shards and Adam moments when the first fit ended and
when the resumed fit started, and the checkpoint the second fit resumed from.
"""

import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.distributed.tensor import DTensor
from typing_extensions import override

from src.cli import main


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded tensor (the tensor itself when it is not sharded)."""
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach().clone()


class Shards(Callback):
    """This rank's parameters and Adam moments when training starts and when it ends."""

    def __init__(self) -> None:
        self.at: dict[str, dict[str, Any]] = {}

    def _grab(self, trainer: L.Trainer, module: L.LightningModule, when: str) -> None:
        optimizer = trainer.optimizers[0]
        named = dict(module.named_parameters())
        self.at[when] = {
            "params": {name: local(p) for name, p in named.items()},
            "full_numel": sum(p.numel() for p in named.values()),
            "local_numel": sum(local(p).numel() for p in named.values()),
            "sharded": all(isinstance(p, DTensor) for p in named.values()),
            "exp_avg": {
                n: local(optimizer.state[p]["exp_avg"]) for n, p in named.items() if p in optimizer.state
            },
            "global_step": trainer.global_step,
        }

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._grab(trainer, pl_module, "start")

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._grab(trainer, pl_module, "end")


def run() -> None:
    out, words = Path(sys.argv[1]), sys.argv[2:]
    first = main([*words, "--trainer.max_epochs=2"], run=False)
    first_shards = Shards()
    first.trainer.callbacks.append(first_shards)
    first.trainer.fit(first.model, datamodule=first.datamodule)
    checkpoint = first.trainer.checkpoint_callback.best_model_path  # a folder of shards

    second = main([*words, "--trainer.max_epochs=3"], run=False)
    second_shards = Shards()
    second.trainer.callbacks.append(second_shards)
    second.trainer.fit(second.model, datamodule=second.datamodule, ckpt_path=checkpoint)

    report = {
        "rank": second.trainer.global_rank,
        "world_size": second.trainer.world_size,
        "checkpoint": checkpoint,
        "first_end": first_shards.at["end"],
        "resumed_start": second_shards.at["start"],
        "resumed_end": second_shards.at["end"],
    }
    torch.save(report, out / f"rank{second.trainer.global_rank}.pt")


if __name__ == "__main__":
    run()
