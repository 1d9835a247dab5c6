"""Resuming a run: the random generators' state in each checkpoint, and a checkpoint when SIGTERM or Ctrl-C
stops it."""

import os
import random
import shlex
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from src.errors import process_group_error
from src.extras.resume.threads import CpuThreads


class Resume(Callback):
    """What a resumed fit needs to go on bit for bit, and a checkpoint when SIGTERM or Ctrl-C stops the fit.

    ``random_state``: the state of torch's, numpy's and Python's generators goes into every checkpoint
    and is restored when training starts from one, so that dropout and anything else a user's code
    draws at random continue the uninterrupted run's stream (the shuffle's own generator travels with
    the DataModule). Restored at the start of training, after the sanity check, which may draw too.

    ``preemption``: SIGTERM (a scheduler's preemption, ``kill``, ``docker stop``) ends the fit at the end
    of the step under way with ``last.ckpt`` (where the checkpoint callback without a monitor keeps it)
    holding everything a resume needs, mid-epoch included, and the command that goes on from that very
    step: the run's own words (:attr:`command`, which the CLI sets) with ``--ckpt_path`` naming the saved
    file; the exit status is 143. Ctrl-C (SIGINT) does the same, with exit status 130: Lightning turns it
    into a KeyboardInterrupt inside the step under way, which ends the fit with status 1 and, under DDP,
    the other processes outright. With ``trainer.enable_checkpointing=false`` it writes nothing, and says
    so. On SLURM, Lightning's own SIGUSR1 handling saves and requeues instead.

    During the fit this callback's own handler only notes the signal, and the fit stops at the end
    of the next training batch, never inside a validation or an epoch's end: Lightning's own handling
    stops within a validation, whose metrics then never reach the checkpoint, the best model's tracking
    or early stopping's patience, and a resume counts that validation as run. A signal noted during the
    last epoch's closing validation stops the fit at its end, before a test after it. In several
    processes, the ranks agree at the end of each training batch (one all-reduce of the note) whether to
    stop: all save together, say so and end (SIGTERM's status where any rank got one, else Ctrl-C's); so
    do torchrun's workers whose torchrun was killed outright (Lightning's handler broadcasts inside the
    signal handler, in the middle of whatever collective the process was in, and the ranks hang). A rank
    that loses the others (a killed process, a taken port) leaves its error a note naming the last
    checkpoint, and a launcher whose processes never met stops the ones it started.

    ``cpu_threads``: torch's threads within one operation while the fit runs on the CPU
    (:class:`~src.extras.resume.threads.CpuThreads`): the shipped small nets train fastest with 1, and a
    resume on another count would sum floats in another order.

    Args:
        random_state: Keep the generators' state in every checkpoint and restore it.
        preemption: Save ``last.ckpt`` and stop on SIGTERM and on Ctrl-C.
        cpu_threads: Intra-op threads during the run on the CPU; ``None`` leaves torch's setting alone.
    """

    def __init__(
        self, random_state: bool = True, preemption: bool = True, cpu_threads: int | None = 1
    ) -> None:
        self.random_state = random_state
        self.preemption = preemption
        #: sets torch's threads for the run and restores them after it
        self.threads = CpuThreads(cpu_threads)
        self._restored: dict[str, Any] | None = None
        self.saved: Path | None = None
        #: the words that started the run (``fit --config ...``), repeated in the advice to resume
        self.command: list[str] | None = None
        self._signalled: int | None = None  # the signal that arrived (SIGTERM over SIGINT); the ranks act
        # on it at the end of a training batch
        self._noting = False  # this callback's handlers are on
        self._previous: dict[int, Any] = {}  # the handlers they replaced, by signal
        self._launcher_pid: int | None = None  # torchrun's agent, which starts and watches this process
        self._stopped = False  # every rank saved and said so

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
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.threads.setup(trainer, pl_module, stage)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.threads.teardown(trainer, pl_module, stage)

    @override
    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_signals(trainer)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_signals(trainer)
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

    def _take_signals(self, trainer: L.Trainer) -> None:
        """SIGTERM is noted by this callback's handler instead of Lightning's (which Lightning installs
        before the sanity check and restores when the fit ends), and so is SIGINT where Python's own
        handler has it (not where it is ignored, as in a job started in the background)."""
        if not self.preemption or self._noting or trainer.received_sigterm:
            return  # (Lightning's handler heard it first: Lightning stops at its next check)
        if threading.current_thread() is not threading.main_thread():  # only the main thread may
            return
        strategy = trainer.strategy
        if isinstance(strategy, ParallelStrategy) and isinstance(
            strategy.cluster_environment, TorchElasticEnvironment
        ):
            # torchrun killed outright leaves its workers training on their own: they stop as on SIGTERM
            self._launcher_pid = os.getppid()
        launcher = strategy.launcher

        def note(signum: int, frame: FrameType | None) -> None:
            if signum == signal.SIGTERM and self._signalled != signum and launcher is not None:
                # the processes this one started hear it too, as with Lightning's. Not SIGINT: a terminal
                # sends Ctrl-C to all of them already, as torchrun passes it on, and the ranks learn of a
                # signal only one of them got at the next batch's end anyway
                launcher.kill(signum)
            if self._signalled != signal.SIGTERM:
                self._signalled = signum

        self._previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, note)}
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, note)
        self._noting = True

    def _give_back_signals(self) -> None:
        if self._noting and threading.current_thread() is threading.main_thread():
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
            self._noting = False

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._noting:
            return
        orphaned = self._launcher_pid is not None and os.getppid() != self._launcher_pid
        # every rank ends every training batch here, so this all-reduce pairs up across ranks; any rank's
        # note stops them all at the same step
        if trainer.strategy.reduce_boolean_decision(self._signalled is not None or orphaned, all=False):
            self._stop(trainer, orphaned)

    def _stop(self, trainer: L.Trainer, orphaned: bool = False) -> None:
        """Every rank saves, says so and ends the fit, with the same exit status: SIGTERM's where any rank
        got SIGTERM or lost its launcher, else Ctrl-C's."""
        terminated = trainer.strategy.reduce_boolean_decision(
            self._signalled == signal.SIGTERM or orphaned, all=False
        )
        signum = signal.SIGTERM if terminated else signal.SIGINT
        saved = self._save(trainer)
        if saved is not None:
            # the run ends here: the file is whole before any rank leaves (Lightning's launcher kills
            # itself once one of its children has exited)
            trainer.strategy.checkpoint_io.teardown()
        trainer.strategy.barrier()
        self._stopped = True
        why = "by SIGTERM" if terminated else "by Ctrl-C (SIGINT)"
        if orphaned and self._signalled != signal.SIGTERM:
            why = "because its launcher is gone"
        if trainer.world_size == 1:
            rank_zero_info(self._sentence(trainer, saved, why=why))
        else:
            who = f"rank {trainer.global_rank} of {trainer.world_size}"
            # one write, newline included: the ranks share one output, and an unbuffered print
            # (PYTHONUNBUFFERED) writes its end apart, so another rank's sentence could land in between
            print(self._sentence(trainer, saved, who, why) + "\n", end="", flush=True)
        # Lightning's exception for a fit stopped from outside at a step's end, which the other callbacks
        # know to be saved already; its code is the exit status a shell gives the signal
        raise SIGTERMException(128 + signum)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        noted = self._noting and trainer.strategy.reduce_boolean_decision(
            self._signalled is not None, all=False
        )
        self._give_back_signals()
        if noted:
            # noted after the last training batch (in the closing validation, at the epoch's end): the fit
            # is over, and the stop goes before anything after it (a test)
            self._stop(trainer)

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self.threads.on_exception(trainer, pl_module, exception)
        self._give_back_signals()
        if not self.preemption:
            return
        lost = process_group_error(exception)
        if lost is not None:
            self._lost(trainer, lost)
            return
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != TrainerFn.FITTING:
            return
        if self._stopped:  # saved and said where the stop was decided
            return
        if trainer.global_step == 0:
            # SIGTERM heard by Lightning's handler, before this callback's took over (the fit's setup): a
            # state taken now holds the generators inside the sanity check's own, later undone, draws, and
            # a fresh start is this very run anyway
            rank_zero_info(
                "Stopped by SIGTERM before the first training step; nothing was saved: start the run again "
                "with the same command."
            )
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

    def _sentence(self, trainer: L.Trainer, saved: Path | None, who: str = "", why: str = "") -> str:
        stopped = f"Stopped {why or 'by SIGTERM'} after step {trainer.global_step}"
        if who:  # several processes: each says it, naming itself
            stopped = f"Stopped after step {trainer.global_step} ({who}) {why or 'by SIGTERM'}"
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

    def _lost(self, trainer: L.Trainer, exception: BaseException) -> None:
        """Another process is gone, or the processes never met: the error gets a note of what is on disk
        (the CLI's sentence says it), and the processes this one started go too, which would otherwise
        wait for a rendezvous that never comes."""
        launcher = trainer.strategy.launcher
        if launcher is not None and not dist.is_initialized():
            # the processes never met: the ones started here wait in a connect that no signal handler
            # interrupts (once they have met, each learns of a lost peer itself and says so)
            launcher.kill(signal.SIGKILL)
        written = [Path(c.best_model_path) for c in trainer.checkpoint_callbacks
                   if isinstance(c, ModelCheckpoint) and c.monitor is None and c.best_model_path]  # fmt: skip
        note = f"nothing was saved after step {trainer.global_step}"
        if written:
            advice = self.advice(written[0]).rstrip(".")
            note += f"; the last checkpoint, {written[0]}, is whole; {advice[0].lower()}{advice[1:]}"
        exception.add_note(note)  # the CLI's one sentence ends with it

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
