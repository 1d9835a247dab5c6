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


class Resume(Callback):
    """What a resumed fit needs to go on bit for bit, and a checkpoint when SIGTERM stops the fit.

    ``random_state``: the state of torch's, numpy's and Python's generators goes into every checkpoint
    and is restored when training starts from one, so that dropout and anything else a user's code
    draws at random continue the uninterrupted run's stream (the shuffle's own generator travels with
    the DataModule). Restored at the start of training, after the sanity check, which may draw too.

    ``preemption``: SIGTERM (a scheduler's preemption, ``kill``, ``docker stop``) ends the fit at the end
    of the step under way with ``last.ckpt`` (where the checkpoint callback without a monitor keeps it)
    holding everything a resume needs, mid-epoch included, and the command that goes on from that very
    step: the run's own words (:attr:`command`, which the CLI sets) with ``--ckpt_path`` naming the saved
    file. With ``trainer.enable_checkpointing=false`` it writes nothing, and says so. On SLURM,
    Lightning's own SIGUSR1 handling saves and requeues instead.

    Lightning notices SIGTERM at the end of the current training step and stops there; this callback
    then saves.

    Args:
        random_state: Keep the generators' state in every checkpoint and restore it.
        preemption: Save ``last.ckpt`` and stop on SIGTERM.
    """

    def __init__(self, random_state: bool = True, preemption: bool = True) -> None:
        self.random_state = random_state
        self.preemption = preemption
        self._restored: dict[str, Any] | None = None
        self.saved: Path | None = None
        #: the words that started the run (``fit --config ...``), repeated in the advice to resume
        self.command: list[str] | None = None

    @property
    @override
    def state_key(self) -> str:
        # the key that checkpoints have carried the generators under since they were a callback of their own
        return "RandomState"

    @override
    def state_dict(self) -> dict[str, Any]:
        if not self.random_state:
            return {}
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
        self._restored = state_dict if self.random_state and state_dict else None

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

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if not self.preemption:
            return
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return
        rank_zero_info(self._sentence(trainer, self._save(trainer)))

    def _save(self, trainer: L.Trainer) -> Path | None:
        """``last.ckpt`` with everything a resume restores; ``None`` where checkpointing is off."""
        if not trainer.checkpoint_callbacks:  # trainer.enable_checkpointing=false: no checkpoint, as asked
            return None
        path = self._last_path(trainer)
        trainer.save_checkpoint(path, weights_only=False)  # everything a resume restores, not the weights
        self.saved = path
        return path

    def _sentence(self, trainer: L.Trainer, saved: Path | None) -> str:
        stopped = f"Stopped by SIGTERM after step {trainer.global_step}"
        if saved is None:
            return f"{stopped}; nothing was saved, since trainer.enable_checkpointing is false."
        return f"{stopped}; saved {saved}. {self.advice(saved)}"

    @staticmethod
    def _last_path(trainer: L.Trainer) -> Path:
        folders = [Path(c.dirpath) for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)
                   and c.monitor is None and c.dirpath]  # fmt: skip
        logger = trainer.logger
        if folders:
            return folders[0] / "last.ckpt"
        if logger is not None and logger.log_dir is not None:
            return Path(logger.log_dir) / "checkpoints" / "last.ckpt"
        return Path(trainer.default_root_dir) / "last.ckpt"

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
