"""Resuming a run: the random generators' state in each checkpoint, and a checkpoint when SIGTERM stops it."""

import random
import shlex
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override


class RandomState(Callback):
    """Saves the state of torch's, numpy's and Python's generators in every checkpoint; restores it when
    training starts from one.

    Dropout and anything else a user's code draws at random then continue the uninterrupted run's
    stream, so that ``--ckpt_path last`` goes on bit for bit (the shuffle's own generator travels with
    the DataModule). Restored at the start of training, after the sanity check, which may draw too.
    """

    def __init__(self) -> None:
        self._restored: dict[str, Any] | None = None

    @override
    def state_dict(self) -> dict[str, Any]:
        # the legacy global generator is exactly what a user's np.random.* calls draw from
        numpy_state: Any = np.random.get_state(legacy=True)  # noqa: NPY002
        name, keys, position, has_gauss, cached = numpy_state
        version, internal, gauss = random.getstate()
        state: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            # plain data only, so that torch.load(weights_only=True) reads it: lists and tensors (the
            # generators' 624 words (625 numbers for Python's) each as one tensor, not as that many numbers
            # that every save walks over)
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
            "python": [version, torch.tensor(internal, dtype=torch.int64), gauss],
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = state_dict

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state, self._restored = self._restored, None
        if state is None:
            return
        torch.set_rng_state(state["torch"])
        name, keys, position, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))  # noqa: NPY002
        version, internal, gauss = state["python"]
        words = (
            internal.tolist() if isinstance(internal, torch.Tensor) else internal
        )  # a list: older checkpoints
        random.setstate((version, tuple(words), gauss))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


class Preemption(Callback):
    """SIGTERM (a scheduler's preemption, ``kill``, ``docker stop``) saves a resumable checkpoint and ends
    the run.

    Lightning notices SIGTERM at the end of the current training step and stops there; this callback
    then writes ``last.ckpt`` (where the checkpoint callback without a monitor keeps it) with everything
    a resume needs, mid-epoch included, and says with which command to go on from that very step: the
    run's own words (:attr:`command`, which the CLI sets) with ``--ckpt_path`` naming the saved file.
    With ``trainer.enable_checkpointing=false`` it writes nothing, and says so. On SLURM, Lightning's own
    SIGUSR1 handling saves and requeues instead.
    """

    def __init__(self) -> None:
        self.saved: Path | None = None
        #: the words that started the run (``fit --config ...``), repeated in the advice to resume
        self.command: list[str] | None = None

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return
        if trainer.global_step == 0:
            # SIGTERM during the sanity check (or before the first optimizer step): its generators' state is
            # taken inside the check's own, later undone, draws, and a fresh start is this very run anyway
            rank_zero_info(
                "Stopped by SIGTERM before the first training step; nothing was saved: start the run again "
                "with the same command."
            )
            return
        if not trainer.checkpoint_callbacks:  # trainer.enable_checkpointing=false: no checkpoint, as asked
            rank_zero_info(
                f"Stopped by SIGTERM after step {trainer.global_step}; nothing was saved, since "
                "trainer.enable_checkpointing is false."
            )
            return
        folders = [Path(c.dirpath) for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)
                   and c.monitor is None and c.dirpath]  # fmt: skip
        logger = trainer.logger
        if folders:
            path = folders[0] / "last.ckpt"
        elif logger is not None and logger.log_dir is not None:
            path = Path(logger.log_dir) / "checkpoints" / "last.ckpt"
        else:
            path = Path(trainer.default_root_dir) / "last.ckpt"
        trainer.save_checkpoint(
            path, weights_only=False
        )  # everything a resume restores, not the weights alone
        self.saved = path
        rank_zero_info(
            f"Stopped by SIGTERM after step {trainer.global_step}; saved {path}. {self.advice(path)}"
        )

    def advice(self, path: Path) -> str:
        """How to go on from ``path``: the run's own command with ``--ckpt_path`` naming it."""
        if self.command is None:
            return f"Resume with the same command and --ckpt_path {shlex.quote(str(path))}."
        words, skip = [], False
        for word in self.command:  # any earlier --ckpt_path goes: the saved file replaces it
            if skip or word.startswith("--ckpt_path="):
                skip = False
                continue
            skip = word == "--ckpt_path"
            if not skip:
                words.append(word)
        return f"Resume with: python -m src.cli {shlex.join([*words, '--ckpt_path', str(path)])}"
