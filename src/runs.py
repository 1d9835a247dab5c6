"""Run folders (``<save_dir>/<name>/<version>/``): which run a checkpoint is of, and one fit at a time."""

import fcntl
import functools
import os
import shutil
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from jsonargparse import Namespace
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from src.errors import UserInputError, notice
from src.files import written
from src.settings import CARRIED, PER_INVOCATION, callback_sections


def run_of(ckpt_path: str | Path) -> Path | None:
    """The run folder of ``<run>/checkpoints/<file>.ckpt``, or ``None`` for a checkpoint elsewhere."""
    folder = Path(ckpt_path).resolve().parent
    return folder.parent if folder.name == "checkpoints" else None


def resumed_folders(run: Path, ckpt_path: str, logger: Any, typed: bool) -> tuple[str, str] | None:
    """The ``save_dir`` and ``name`` that lead a fit resumed from ``ckpt_path`` into its folder ``run``;
    ``None`` when a ``typed`` logger folder leads elsewhere. Paths are kept as written: Lightning restores a
    ModelCheckpoint's best-so-far only when its folder reads as the text it saved."""
    save_dir, name = str(logger.get("save_dir")), str(logger.get("name") or "")
    if (Path(save_dir) / name).resolve() == run.parent:
        return save_dir, name
    if typed:
        return None
    written = Path(ckpt_path).parent.parent  # <save_dir>/<name>/<version>, as the path is written
    if written.resolve() == run:
        return str(written.parent.parent), written.parent.name
    return str(run.parent.parent), run.parent.name


def step_of(ckpt_path: str | Path) -> int:
    """The optimizer steps a checkpoint had taken, read without loading its tensors (memory-mapped)."""
    try:
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # a file that is no whole checkpoint has taken no step worth keeping track of
        return -1
    step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
    return step if isinstance(step, int) else -1


def replaced_by_resuming(ckpt_path: str | Path, run: Path) -> Path | None:
    """The run's ``last.ckpt`` when it got further than ``ckpt_path``, which a resume would replace."""
    last = run / "checkpoints" / "last.ckpt"
    if not last.is_file() or last.resolve() == Path(ckpt_path).resolve():
        return None
    return last if step_of(last) > step_of(ckpt_path) else None


def resumable_step(ckpt_path: Path) -> int | None:
    """The optimizer steps of a checkpoint of a fit's full state (memory-mapped), else ``None``."""
    try:
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a whole checkpoint
        return None
    full = isinstance(checkpoint, dict) and all(key in checkpoint for key in ("optimizer_states", "loops"))
    step = checkpoint.get("global_step") if full else None
    return step if isinstance(step, int) else None


def last_of_run(base: Path, version: Any) -> Path | None:
    """What ``--ckpt_path last`` goes on from in the run folder ``version`` under ``base``: its ``last.ckpt``,
    else its newest whole checkpoint; ``None`` (a fresh start, as a requeued job's first) where it holds
    none. Refused without a named folder, or where no checkpoint is whole."""
    if version is None:
        raise UserInputError(
            f"--ckpt_path last goes on from the run folder under {base} that "
            "trainer.logger.init_args.version names, and none is named; name it (the same on every start of "
            "the run), or give --ckpt_path the path of the checkpoint to resume from."
        )
    checkpoints = base / str(version) / "checkpoints"
    if (checkpoints / "last.ckpt").is_file():
        return checkpoints / "last.ckpt"
    held = checkpoints_in(checkpoints)
    steps = {path: step for path in held if (step := resumable_step(path)) is not None}
    if steps:
        newest = max(steps, key=lambda path: (steps[path], path.stat().st_mtime))
        notice(
            f"--ckpt_path last finds no last.ckpt in {checkpoints}: this fit goes on from its newest "
            f"checkpoint, {newest.name} (step {steps[newest]})."
        )
        return newest
    if held:
        raise UserInputError(
            f"--ckpt_path last finds no last.ckpt in {checkpoints}, and none of its checkpoints "
            f"({', '.join(path.name for path in held[:3])}) holds a whole fit's state; give --ckpt_path the "
            "checkpoint to resume from, or name another trainer.logger.init_args.version."
        )
    notice(
        f"--ckpt_path last finds no last.ckpt in {checkpoints}: this fit starts afresh there, and the "
        "same command resumes from the checkpoints it writes."
    )
    return None


def checkpoints_in(folder: Path) -> list[Path]:
    """The checkpoints a run folder holds, at any depth."""
    return sorted(folder.rglob("*.ckpt")) if folder.is_dir() else []


def first_process() -> bool:
    """Whether this process is global rank 0, from what launchers set before the Trainer knows its rank."""
    for key in ("RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key]) == 0
    return int(os.environ.get("LOCAL_RANK", 0)) == 0 and int(os.environ.get("NODE_RANK", 0)) == 0


class RunLock:
    """An exclusive ``flock`` on a run folder, which the system releases however the process ends."""

    def __init__(self) -> None:
        self._held: int | None = None

    def acquire(self, folder: Path) -> bool:
        """Lock ``folder`` (made when missing); ``False`` when another process holds it."""
        folder.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return False
        self.release()
        self._held = descriptor
        return True

    def release(self) -> None:
        if self._held is not None:
            os.close(self._held)  # closing the descriptor releases its lock
            self._held = None


class SaveConfig(SaveConfigCallback):
    """Writes ``config.yaml`` beside the run, and the model and data sections into every checkpoint."""

    #: the outermost logger folder this run creates, when ``<save_dir>/<name>`` does not exist yet
    made_folder: Path | None = None
    #: whether the run's version folder is new (an automatic ``version_N``, or a named one not there yet)
    new_version: bool = False

    @functools.cached_property
    def lock(self) -> RunLock:
        """Held on the run folder while a fit writes into it."""
        return RunLock()

    @functools.cached_property
    def config_text(self) -> str:
        """The run's resolved config as YAML, dumped once (it does not change while the run lasts)."""
        return self.parser.dump(self.config, skip_none=False, skip_validation=True)

    @functools.cached_property
    def carried(self) -> dict[str, Any]:
        """What every checkpoint carries of the config, as plain data (``weights_only=True`` reads it)."""
        dumped = yaml.safe_load(self.config_text)
        # the run's choices too, for its evaluations: the logger, and the callback sections on and off
        carried = {key: dumped[key] for key in (*CARRIED, *callback_sections()) if key in dumped}
        if "logger" in (dumped.get("trainer") or {}):
            carried["trainer"] = {"logger": dumped["trainer"]["logger"]}
        for key in PER_INVOCATION:
            (carried.get("data", {}).get("init_args") or {}).pop(key, None)
        return carried

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # none for predict, nor without a logger (Lightning would write it into the working folder)
        if stage == "predict" or trainer.logger is None or self.already_saved:
            return
        folder = trainer.log_dir  # a collective under DDP: every process asks
        if trainer.is_global_zero and folder is not None:
            with written(Path(folder) / self.config_filename) as (partial,):
                partial.write_text(self.config_text)
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)

    def refusal(self, folder: Path) -> str | None:
        """Why this fit may not write into ``folder``, or ``None`` (the first process then holds its lock)."""
        held = checkpoints_in(folder)
        resumed = self.config.get("ckpt_path")
        if resumed == "last":  # Lightning's name for the run folder's own last.ckpt (check_last found it)
            resumed = str(folder / "checkpoints" / "last.ckpt")
        inside = resumed is not None and run_of(resumed) == folder.resolve()
        if held and not inside and not self.config.get("overwrite"):
            last = folder / "checkpoints" / "last.ckpt"
            resume = last if last.is_file() else "last"  # killed in its first minute: its newest
            return (
                f"{folder} holds the checkpoints of an earlier run ({', '.join(p.name for p in held[:3])}); "
                f"resume it with --ckpt_path {resume}, name another trainer.logger.init_args.version, or "
                "pass --overwrite true to write over it."
            )
        further = replaced_by_resuming(resumed, folder) if inside else None
        if further is not None and not self.config.get("overwrite"):
            return (
                f"--ckpt_path {resumed} is an earlier state of the run in {folder}, whose {further.name} got "
                "further; resuming there would replace it. Leave trainer.logger.init_args.version out (the "
                "resumed fit then writes a new version), or pass --overwrite true."
            )
        if first_process() and not self.lock.acquire(folder):
            return (
                f"another process is writing into {folder}; wait for it to end, or name another "
                "trainer.logger.init_args.version."
            )
        return None

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.lock.release()

    @override
    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        logger = trainer.logger  # TensorBoard's Text tab shows the config beside the run's curves
        if isinstance(logger, TensorBoardLogger) and trainer.is_global_zero and stage != "predict":
            logger.experiment.add_text("run/config", f"```yaml\n{self.config_text}\n```")

    @override
    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint["config"] = self.carried  # read, never changed: the same plain data in every checkpoint

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self.lock.release()
        # a run that failed before its first step leaves no folder (empty version_N folders hide the runs
        # that matter); only a folder this very run created is removed
        logger = trainer.logger
        version = Path(logger.log_dir) if self.new_version and isinstance(logger, TensorBoardLogger) else None
        folder = self.made_folder or version
        # a fit that took a step may have logged curves worth keeping; a failed evaluation has nothing
        trained = trainer.state.fn == TrainerFn.FITTING and trainer.global_step > 0
        if folder is None or not trainer.is_global_zero or trained:
            return
        if folder.is_dir() and not any(folder.rglob("*.ckpt")):
            for each in trainer.loggers:  # closed first: a writer thread must not write into a removed folder
                each.finalize("failed")
            shutil.rmtree(folder, ignore_errors=True)


def place_logging(config: Any, subcommand: str, ckpt_path: str, words: list[str]) -> None:
    """Where a run given a checkpoint logs (``config`` changed in place): ``fit`` into the checkpoint's run
    folder (unless named, typed elsewhere, or the run got further: a new version); unless the user said,
    ``validate`` and ``test`` inside that folder and ``predict`` nowhere."""
    typed = any(word.startswith("--trainer.logger") for word in words)
    if typed and subcommand != "fit":
        return
    if subcommand == "predict":
        config["trainer"]["logger"] = False  # no run folder for a prediction
        return
    logger = config.get("trainer.logger")
    run = run_of(ckpt_path)
    # any logger that writes into <save_dir>/<name>/<version> (TensorBoard's, CSV's)
    arguments = logger.get("init_args") if isinstance(logger, Namespace) else None
    foldered = isinstance(arguments, Namespace) and {"save_dir", "name", "version"} <= set(arguments.keys())
    if run is None or not foldered or not (run / "config.yaml").is_file():
        return
    if subcommand == "fit":
        if logger.get("init_args.version") is not None:
            return  # the user named the folder: SaveConfig.refusal checks it
        if (further := replaced_by_resuming(ckpt_path, run)) is not None:
            notice(
                f"{ckpt_path} is an earlier state of the run in {run}, whose {further.name} got further: "
                "this fit writes a new version and leaves that run as it is."
            )
            return
        folders = resumed_folders(run, ckpt_path, logger["init_args"], typed)
        if folders is None:
            return
        (save_dir, name), version = folders, run.name
    else:
        save_dir, name = str(run.parent.parent), run.parent.name
        version = f"{run.name}/{subcommand}-{Path(ckpt_path).stem}"
    logger["init_args"]["save_dir"] = save_dir
    logger["init_args"]["name"] = name
    logger["init_args"]["version"] = version


def prepare_folder(trainer: Any, config: Any, subcommand: str | None) -> Any:
    """Tell :class:`SaveConfig` what this run creates; return the ``ckpt_path`` to go on from."""
    logger = trainer.logger
    saver = next((c for c in trainer.callbacks if isinstance(c, SaveConfig)), None)
    if not isinstance(logger, TensorBoardLogger) or saver is None:
        return config.get("ckpt_path")
    base = Path(logger.save_dir) / logger.name
    if not base.exists():
        made = base
        while not made.parent.exists():
            made = made.parent
        saver.made_folder = made
    named = config["trainer"]["logger"]["init_args"].get("version")
    saver.new_version = named is None or not (base / str(named)).exists()
    if subcommand != "fit" or config.get("ckpt_path") != "last":
        return config.get("ckpt_path")
    found = last_of_run(base, named)
    return None if found is None else str(found.resolve())  # absolute, as Lightning's own "last" names it
