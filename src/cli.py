"""The command line: ``python -m src.cli {fit,validate,test,predict} --config configs/<name>.yaml``.

``configs/defaults.yaml`` is read first by every subcommand; each ``--config`` after it overrides it,
and the later of several ``--config`` wins. ``--print_config`` shows the merged result.

A checkpoint carries its run's model and data settings and the fitted preprocessing, so
``validate``, ``test`` and ``predict`` need nothing but ``--ckpt_path`` (a ``--config`` still wins):

    python -m src.cli predict --ckpt_path CKPT --data.predict_path new.csv --output predictions.csv
"""

import copy
import functools
import inspect
import logging
import os
import shutil
import signal
import sys
import warnings
from pathlib import Path

# Lightning 2.6.6 calls jsonargparse APIs that jsonargparse 4.53 marks deprecated; the notice is meant
# for Lightning's maintainers and only adds noise to every run here.
os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")

if __name__ == "__main__":
    # before Lightning is imported here: predict on a table's checkpoint needs neither it nor the Trainer
    from src import console

    console()
    sys.exit(0)

from typing import Any

import lightning as L
import yaml
from jsonargparse import Namespace
from lightning.pytorch.callbacks import (
    BasePredictionWriter,
    Callback,
    EarlyStopping,
    ModelCheckpoint,
    ModelSummary,
)
from lightning.pytorch.callbacks import ProgressBar as LightningProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from src import runs
from src.callbacks import (
    Baselines,
    CpuThreads,
    Dashboard,
    NonFiniteGuard,
    PredictionWriter,
    Preemption,
    RandomState,
    StepValues,
    ValidationFigures,
)
from src.callbacks.dashboard import environment_text, tensorboard_writer
from src.checkpoints import DOTTED, check_names, load_checkpoint, resolve
from src.cli_errors import Parser, check_config_files, check_log_folder, user_error
from src.data import TabularDataModule
from src.errors import UserInputError, notice
from src.files import check_output
from src.speedups import Speedups

DEFAULTS = Path(__file__).resolve().parent.parent / "configs" / "defaults.yaml"
SUBCOMMANDS = ("fit", "validate", "test", "predict")
#: the sections of a run's config that a checkpoint carries: what it takes to rebuild model and data
CARRIED = ("seed_everything", "model", "data")
#: data settings that belong to one invocation, not to the run that made the checkpoint
PER_INVOCATION = ("predict_path", "preprocessing_from")
#: options whose values are paths, never class names
PATH_OPTIONS = ("--output", "--ckpt_path", "--data.path", "--data.predict_path", "--data.preprocessing_from")
#: the shipped callbacks, one top-level config section each (settings in configs/defaults.yaml), in the
#: order the Trainer gets them: (section, the class it accepts, itself or a subclass; what it is for).
#: A later config changes one setting (``early_stopping: {init_args: {patience: 5}}``) without repeating
#: the others, and ``null`` switches a section off; ``trainer.callbacks`` holds the user's own. Every
#: subcommand has them, so that a config fit reads is one validate/test/predict read too: checkpoints and
#: early stopping act only while fitting, and the prediction writer only in predict.
CALLBACK_SECTIONS: tuple[tuple[str, type[Callback], str], ...] = (
    ("best_checkpoint", ModelCheckpoint, "Keeps the best checkpoints by val/loss."),
    ("last_checkpoint", ModelCheckpoint, "Rewrites last.ckpt at every epoch's end, for resuming."),
    ("early_stopping", EarlyStopping, "Stops training when val/loss stops improving."),
    ("model_summary", ModelSummary, "Parameters per block, printed when the fit starts."),
    # before baselines: at the fit's end the summary prints first, their verdict after it
    ("run_summary", Callback, "At the fit's end: why it ended, the best epoch, where the run is."),
    ("baselines", Baselines, "Gradient boosting and a linear model on the same table rows, for comparison."),
    ("dashboard", Dashboard, "TensorBoard's speed, generalization gap, HParams and layout."),
    ("step_values", StepValues, "Writes the step's loss, learning rate and gradient norm every few steps."),
    ("validation_figures", ValidationFigures, "Confusion matrix or predicted vs true per validation."),
    ("prediction_writer", BasePredictionWriter, "Writes predict's CSV file."),
    ("random_state", RandomState, "Keeps the random generators' states in checkpoints, for resuming."),
    ("preemption", Preemption, "On SIGTERM, saves last.ckpt at the end of the step and stops."),
    ("nonfinite_guard", NonFiniteGuard, "Skips steps with non-finite gradients; stops after too many."),
    ("progress_bar", LightningProgressBar, "The progress bar, refreshed on the logging steps."),
    ("cpu_threads", CpuThreads, "Threads torch uses within one operation on the CPU, during the run."),
)
#: sections whose callbacks act in one subcommand only, and are left out of the others' Trainer: the
#: Trainer calls every callback at each of the six hooks of every training step, whether it acts or not
ONLY_IN = {"prediction_writer": "predict"}


class SaveConfig(SaveConfigCallback):
    """Writes ``config.yaml`` beside the run, and the model and data sections into every checkpoint."""

    #: the outermost logger folder this run creates, when ``<save_dir>/<name>`` does not exist yet
    made_folder: Path | None = None
    #: whether the run's version folder is new (an automatic ``version_N``, or a named one not there yet)
    new_version: bool = False

    @functools.cached_property
    def lock(self) -> runs.RunLock:
        """Held on the run folder while a fit writes into it."""
        return runs.RunLock()

    @functools.cached_property
    def config_text(self) -> str:
        """The run's resolved config as YAML; dumped once, since it does not change while the run lasts
        (a dump takes about 0.2 s, and checkpoints are saved every epoch)."""
        return self.parser.dump(self.config, skip_none=False)

    @functools.cached_property
    def carried(self) -> dict[str, Any]:
        """What every checkpoint carries of the config: plain YAML data (strings, numbers, lists), so
        ``torch.load(weights_only=True)`` still reads it."""
        dumped = yaml.safe_load(self.config_text)
        carried = {key: dumped[key] for key in CARRIED if key in dumped}
        # the logger too, so that evaluations of this checkpoint log under the run's own name
        carried["trainer"] = {"logger": dumped.get("trainer", {}).get("logger")}
        for key in PER_INVOCATION:
            (carried.get("data", {}).get("init_args") or {}).pop(key, None)
        return carried

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # config.yaml goes into the run folder. predict has none (it writes its predictions file only), nor
        # has a run without a logger: Lightning would write the file into the working folder, over any
        # config.yaml of the user's there. Checkpoints carry the config either way.
        if stage != "predict" and trainer.logger is not None:
            super().setup(trainer, pl_module, stage)

    def refusal(self, folder: Path) -> str | None:
        """Why this fit may not write into the run folder ``folder``, or ``None``; the first process then
        holds the folder's lock until the fit ends."""
        held = runs.checkpoints_in(folder)
        resumed = self.config.get("ckpt_path")
        if resumed == "last":  # Lightning's name for the run folder's own last.ckpt (check_last found it)
            resumed = str(folder / "checkpoints" / "last.ckpt")
        inside = resumed is not None and runs.run_of(resumed) == folder.resolve()
        if held and not inside and not self.config.get("overwrite"):
            return (
                f"{folder} holds the checkpoints of an earlier run ({', '.join(p.name for p in held[:3])}); "
                f"resume it with --ckpt_path {folder / 'checkpoints' / 'last.ckpt'}, name another "
                "trainer.logger.init_args.version, or pass --overwrite true to write over it."
            )
        further = runs.replaced_by_resuming(resumed, folder) if inside else None
        if further is not None and not self.config.get("overwrite"):
            return (
                f"--ckpt_path {resumed} is an earlier state of the run in {folder}, whose {further.name} got "
                "further; resuming there would replace it. Leave trainer.logger.init_args.version out (the "
                "resumed fit then writes a new version), or pass --overwrite true."
            )
        if runs.first_process() and not self.lock.acquire(folder):
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
        # Lightning's hook for saving the config elsewhere (global rank 0, once per run): TensorBoard's
        # Text tab shows the resolved config and the environment beside the run's curves
        writer = tensorboard_writer(trainer)
        if writer is not None and stage != "predict":
            writer.add_text("run/config", f"```yaml\n{self.config_text}\n```")
            writer.add_text("run/environment", environment_text(trainer))

    @override
    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint["config"] = copy.deepcopy(self.carried)

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self.lock.release()
        # a run that failed before its first optimizer step (or an evaluation that failed) leaves no
        # folder behind: nothing in it is worth keeping, and a pile of empty version_N folders hides the
        # runs that matter. Only the logger's folder this very run created is removed, never one that
        # was there before.
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


class CLI(LightningCLI):
    """LightningCLI with the data's shapes linked into the model and an optional test after fit."""

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # shapes known only to the data reach the model here, where its constructor asks for them (a
        # module without such an argument is built without it); nobody types them twice
        parser.link_arguments("data.in_features", "model.init_args.in_features", apply_on="instantiate")
        parser.link_arguments("data.out_features", "model.init_args.out_features", apply_on="instantiate")
        for section, base, purpose in CALLBACK_SECTIONS:
            # add_lightning_class_args(subclass_mode=True, required=False) but for two things: a help line
            # of our own, and no entry in LightningCLI's callback keys, which would hand the Trainer a None
            # for a section set to null; instantiate_trainer gives it the sections that are on instead
            parser.add_subclass_arguments(
                base, section, required=False, fail_untyped=False, help=f"{purpose} null: off."
            )
        # the tricks that lean on Lightning's internals, each with an off switch (src/speedups.py)
        parser.add_class_arguments(Speedups, "speedups")
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="After fit, run test on the best checkpoint and print the test metrics (fit only).",
        )
        parser.add_argument(
            "--output",
            type=str | None,
            default=None,
            help="Where predict writes its CSV file (predict only); left out, predictions.csv beside the "
            "checkpoint's run.",
        )
        parser.add_argument(
            "--overwrite",
            type=bool,
            default=False,
            help="predict: replace an existing file at --output (never one of the run's inputs); fit: write "
            "into a run folder that holds another run's checkpoints.",
        )

    @override
    def before_instantiate_classes(self) -> None:
        if self.subcommand is None:  # main(run=False): the classes alone, no subcommand to check
            return
        if self.parsed_model is not None:
            # LightningCLI re-applies the checkpoint's hyperparameters after parsing, over what the user
            # typed; the model as parsed (the checkpoint's settings below the user's) is what runs
            self.config[self.subcommand]["model"] = self.parsed_model
        config = self.config[self.subcommand]
        if isinstance(self.resumed_settings, dict):
            dumped = yaml.safe_load(self.parser.dump(self.config, skip_none=False))[self.subcommand]
            check_resumable(self.resumed_settings.get("model"), dumped.get("model"), config["ckpt_path"])
        if self.subcommand != "fit":
            # an evaluation restores the checkpoint callbacks' state, which only a fit acts on: the notice
            # that their folder changed (the checkpoint was moved, or is evaluated from elsewhere) is no news
            warnings.filterwarnings("ignore", message="The dirpath has changed from")
        if config.get("output") and self.subcommand != "predict":
            raise UserInputError(f"--output belongs to predict, not to {self.subcommand}.")
        if config.get("overwrite") and self.subcommand not in ("fit", "predict"):
            raise UserInputError(f"--overwrite belongs to fit and predict, not to {self.subcommand}.")
        if config.get("output") is not None:
            data = (config.get("data") or {}).get("init_args") or {}
            inputs = [data.get("path"), data.get("predict_path"), data.get("preprocessing_from")]
            files = [str(DEFAULTS), *(str(file) for file in config.get("config") or [])]
            check_output(
                config["output"],
                [*inputs, config.get("ckpt_path"), *files],
                overwrite=bool(config.get("overwrite")),
            )
        if config.get("test_after_fit") and self.subcommand != "fit":
            raise UserInputError(f"--test_after_fit belongs to fit, not to {self.subcommand}.")
        trainer = config.get("trainer") or {}
        if self.subcommand == "fit" and (trainer.get("max_epochs") == 0 or trainer.get("max_steps") == 0):
            raise UserInputError(
                "trainer.max_epochs=0 (or max_steps=0) trains nothing; give at least 1, or -1 for no limit."
            )
        logger = trainer.get("logger")
        if isinstance(logger, dict | type(config)) and logger.get("init_args"):
            check_log_folder(logger["init_args"].get("save_dir"))

    @override
    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        """The Trainer with the shipped callbacks of the sections that are on, then ``trainer.callbacks``.

        A subcommand leaves out the sections that act only in another (:data:`ONLY_IN`);
        ``trainer.enable_checkpointing=false`` leaves out the sections that are ModelCheckpoints, and
        ``trainer.enable_progress_bar=false`` the progress bar, so that each means what it says instead of
        clashing with them (one given in ``trainer.callbacks`` still clashes: the user asked for both).
        """
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        trainer = config.get("trainer") or {}
        shipped = [
            config[section]
            for section, *_ in CALLBACK_SECTIONS
            if config.get(section) is not None
            and (self.subcommand is None or ONLY_IN.get(section, self.subcommand) == self.subcommand)
        ]
        if trainer.get("enable_checkpointing") is False:
            shipped = [c for c in shipped if not isinstance(c, ModelCheckpoint)]
        if trainer.get("enable_progress_bar") is False:
            shipped = [c for c in shipped if not isinstance(c, LightningProgressBar)]
        own = trainer.get("callbacks") or []  # a list, or one callback: the Trainer takes either
        built = super().instantiate_trainer(
            **{"callbacks": [*shipped, *(own if isinstance(own, list) else [own])], **kwargs}
        )
        # the speed-ups apply to the shipped callbacks and those Lightning adds (model summary, config
        # saver); the user's own are left as they are
        speedups = config.get("speedups")
        if isinstance(speedups, Speedups):
            speedups.apply(
                c
                for c in built.callbacks  # type: ignore[attr-defined]
                if any(c is s for s in shipped) or isinstance(c, SaveConfigCallback | ModelSummary)
            )
        return built

    @override
    def after_instantiate_classes(self) -> None:
        logger = self.trainer.logger
        saver = next((c for c in self.trainer.callbacks if isinstance(c, SaveConfig)), None)  # type: ignore[attr-defined]
        if isinstance(logger, TensorBoardLogger) and saver is not None:
            # what this run will create, found without fixing the version number now (two runs built
            # before either starts must still get version_0 and version_1)
            base = Path(logger.save_dir) / logger.name
            if not base.exists():
                made = base
                while not made.parent.exists():
                    made = made.parent
                saver.made_folder = made
            config = self.config[self.subcommand] if self.subcommand else self.config
            named = config["trainer"]["logger"]["init_args"].get("version")
            saver.new_version = named is None or not (base / str(named)).exists()
            if self.subcommand == "fit" and config.get("ckpt_path") == "last":
                check_last(base, named)
        for callback in self.trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(callback, Preemption):
                callback.command = self.typed
        optimizer = getattr(self.model, "optimizer", None)  # the shipped tasks' injected one
        if callable(optimizer):
            # built once on the real parameters now, so that a bad argument (a negative learning rate)
            # is one sentence before the run starts, not a traceback from inside fit
            try:
                optimizer(self.model.parameters())
            except (ValueError, TypeError) as err:
                raise UserInputError(f"model.init_args.optimizer: {err}") from err
        if self.subcommand != "predict":
            return
        config = self.config[self.subcommand]
        for callback in self.trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(callback, PredictionWriter):
                callback.output_path = config.get("output") or callback.output_path
                callback.overwrite = bool(config.get("overwrite")) or callback.overwrite

    def before_fit(self) -> None:
        # before the Trainer starts the fit, whose setup already writes into the run folder
        saver = next((c for c in self.trainer.callbacks if isinstance(c, SaveConfig)), None)  # type: ignore[attr-defined]
        if saver is not None and self.trainer.logger is not None and self.trainer.log_dir is not None:
            refusal = saver.refusal(Path(self.trainer.log_dir))
            if refusal is not None:
                raise UserInputError(refusal)

    def after_predict(self) -> None:
        for callback in self.trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(callback, PredictionWriter) and callback.written is not None:
                print(f"Predictions for {callback.rows_written} rows written to {callback.written}")

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse the words; with a checkpoint file as ``--ckpt_path``, over the settings the checkpoint
        carries (:func:`carried_settings`): what the user typed wins, the checkpoint fills in what they did
        not say, the defaults the rest. Then place the run's logging (:meth:`place_logging`)."""
        words = [str(word) for word in (sys.argv[1:] if args is None else args)]
        check_config_files(words)
        #: the words as typed, for advice that repeats the command
        self.typed = words
        subcommand = next((word for word in words if word in SUBCOMMANDS), None)
        ckpt_path = option_value(words, "--ckpt_path")
        if ckpt_path is None:  # none typed: one may still come from a config file
            super().parse_arguments(parser, args)
            found = self.config.get(f"{subcommand}.ckpt_path") if subcommand else None
            ckpt_path = str(found) if found is not None else None
        if subcommand is not None and ckpt_path is not None and is_checkpoint_file(ckpt_path):
            # one sentence for a URL, a missing, broken or unsafe file; and nothing the checkpoint names is
            # imported while it is parsed unless it is trusted or the user named it
            checkpoint = load_checkpoint(ckpt_path)
            check_names(checkpoint, ckpt_path, user_named(words))
            self.resumed_settings = checkpoint.get("config") if subcommand == "fit" else None
            layer = carried_settings(checkpoint.get("config"), ckpt_path)
            at = words.index(subcommand) + 1
            self.config = parser.parse_args([*words[:at], "--config", yaml.safe_dump(layer), *words[at:]])
            self.place_logging(subcommand, ckpt_path, words)
        elif not hasattr(self, "config"):
            super().parse_arguments(parser, args)
        self.parsed_model = self.config.get(f"{subcommand}.model") if subcommand else None

    def place_logging(self, subcommand: str, ckpt_path: str, words: list[str]) -> None:
        """Where a run given a checkpoint logs, unless the user said (any ``--trainer.logger`` word): ``fit``
        resumes into the checkpoint's own run folder (unless a version is named, or that run got further
        than the checkpoint: then into a new version, leaving the run as it was); ``validate`` and ``test``
        log inside that run folder; ``predict`` logs nothing."""
        if any(word.startswith("--trainer.logger") for word in words):
            return
        config = self.config[subcommand]
        if subcommand == "predict":
            config["trainer"]["logger"] = False  # no run folder for a prediction
            return
        logger = config.get("trainer.logger")
        run = runs.run_of(ckpt_path)
        tensorboard = isinstance(logger, Namespace) and str(logger.get("class_path")).endswith(
            "TensorBoardLogger"
        )
        if run is None or not tensorboard or not (run / "config.yaml").is_file():
            return
        if subcommand == "fit":
            if logger.get("init_args.version") is not None:
                return  # the user named the folder: SaveConfig.refusal checks it
            if (further := runs.replaced_by_resuming(ckpt_path, run)) is not None:
                notice(
                    f"{ckpt_path} is an earlier state of the run in {run}, whose {further.name} got further: "
                    "this fit writes a new version and leaves that run as it is."
                )
                return
            version = run.name
        else:
            version = f"{run.name}/{subcommand}-{Path(ckpt_path).stem}"
        logger["init_args"]["save_dir"] = str(run.parent.parent)
        logger["init_args"]["name"] = run.parent.name
        logger["init_args"]["version"] = version

    #: the settings a checkpoint that ``fit`` resumes from carries
    resumed_settings: Any = None

    def after_fit(self) -> None:
        if not self.config_init[self.subcommand].get("test_after_fit"):
            return
        checkpoint = self.trainer.checkpoint_callback
        best = checkpoint.best_model_path if isinstance(checkpoint, ModelCheckpoint) else ""
        if best:
            print(f"Testing the best checkpoint: {best}")
        else:
            print("No best checkpoint was written; testing the weights as they are.")
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None)


#: what a resumed fit restores from the checkpoint instead of building it from the settings
RESTORED = ("optimizer", "scheduler", "scheduler_interval")


def check_resumable(saved: Any, now: Any, ckpt_path: str) -> None:
    """Refuse a resumed fit whose optimizer or scheduler settings differ from those the checkpoint was
    trained with: their state comes back from the checkpoint, and a changed setting would be dropped."""
    if not isinstance(saved, dict) or not isinstance(now, dict):
        return
    for key in RESTORED:
        before = (saved.get("init_args") or {}).get(key)
        after = (now.get("init_args") or {}).get(key)
        for where, old, new in differences(before, after, f"model.init_args.{key}"):
            raise UserInputError(
                f"{where}={new!r} differs from {old!r}, which --ckpt_path {ckpt_path} was trained with; "
                "a resumed fit restores its optimizer and schedule as saved, so leave the setting out to "
                "resume, or start a new fit."
            )


def differences(old: Any, new: Any, where: str) -> list[tuple[str, Any, Any]]:
    """``(key, old value, new value)`` for each setting that differs between two nested configs; a
    changed class is one difference (its own arguments are then a new class's)."""
    if isinstance(old, dict) and isinstance(new, dict):
        if old.get("class_path") != new.get("class_path"):
            return [(f"{where}.class_path", old.get("class_path"), new.get("class_path"))]
        keys = [key for key in new if key in old and key != "class_path"]
        return [found for key in keys for found in differences(old[key], new[key], f"{where}.{key}")]
    return [] if old == new else [(where, old, new)]


def check_last(base: Path, version: Any) -> None:
    """``--ckpt_path last`` resumes from ``last.ckpt`` of the named run folder under ``base``
    (``<save_dir>/<name>``); one sentence, with the path to give instead, when there is none."""
    if version is not None and (base / str(version) / "checkpoints" / "last.ckpt").is_file():
        return
    found = sorted(base.glob("*/checkpoints/last.ckpt"), key=lambda path: path.stat().st_mtime)
    where = f"{base / str(version) / 'checkpoints'}" if version is not None else f"a new version of {base}"
    hint = f"--ckpt_path {found[-1]}" if found else "the path of the checkpoint to resume from"
    raise UserInputError(f"--ckpt_path last finds no last.ckpt in {where}; give {hint}.")


def option_value(words: list[str], key: str) -> str | None:
    """The value given to ``--key`` as ``--key value`` or ``--key=value``, the last one winning."""
    found = None
    for i, word in enumerate(words):
        if word == key and i + 1 < len(words):
            found = words[i + 1]
        elif word.startswith(key + "="):
            found = word[len(key) + 1 :]
    return found


def is_checkpoint_file(ckpt_path: str) -> bool:
    """Whether ``--ckpt_path`` names a file (or something refused in one sentence as one: a URL, a folder,
    a missing file) rather than Lightning's ``last``, ``best``, ``hpc`` or ``registry``."""
    return ckpt_path not in ("last", "best", "hpc") and not ckpt_path.startswith("registry")


def carried_settings(config: Any, ckpt_path: str) -> dict[str, Any]:
    """What of a checkpoint's carried config a later run takes: what :class:`SaveConfig` writes there (the
    model, the data, the seed) and the logger's run name, and nothing else a file from elsewhere could add
    (callbacks, an output path, a logger writing to a folder of its choosing); the data reads the
    checkpoint's fitted preprocessing when its DataModule takes one (``preprocessing_from``)."""
    config = config if isinstance(config, dict) else {}
    taken = {key: copy.deepcopy(config[key]) for key in CARRIED if key in config}
    logger = (config.get("trainer") or {}).get("logger") if isinstance(config.get("trainer"), dict) else None
    name = (logger.get("init_args") or {}).get("name") if isinstance(logger, dict) else None
    if isinstance(name, str):
        taken["trainer"] = {"logger": {"init_args": {"name": name}}}
    data = taken.setdefault("data", {})
    for key in PER_INVOCATION:
        (data.get("init_args") or {}).pop(key, None)
    found = resolve(data["class_path"]) if isinstance(data.get("class_path"), str) else TabularDataModule
    if isinstance(found, type) and "preprocessing_from" in inspect.signature(found).parameters:
        data.setdefault("init_args", {})["preprocessing_from"] = ckpt_path
    return taken


def config_files(words: list[str]) -> list[str]:
    """The config files ``words`` give with ``--config`` (not inline YAML), after the defaults."""
    given = [
        words[i + 1] if word in ("--config", "-c") else word.split("=", 1)[1]
        for i, word in enumerate(words)
        if (word in ("--config", "-c") and i + 1 < len(words)) or word.startswith("--config=")
    ]
    return [str(DEFAULTS), *(value for value in given if "\n" not in value and Path(value).is_file())]


def user_named(words: list[str]) -> set[str]:
    """Every dotted name the user wrote: in the words themselves and in the config files they give.

    A word that names a file (``model.ckpt``, ``data.csv``), or the value of an option that takes a path
    (:data:`PATH_OPTIONS`), names no class, whatever its dots.
    """
    values = [
        word.split("=", 1)[-1]
        for i, word in enumerate(words)
        if not word.startswith(PATH_OPTIONS) and (i == 0 or words[i - 1] not in PATH_OPTIONS)
    ]
    # inline YAML is the checkpoint's own settings; an existing path is a file, not a class
    texts = [value for value in values if "\n" not in value and not Path(value).exists()]
    texts += [Path(file).read_text(errors="replace") for file in config_files(words)]
    return {name for text in texts for name in DOTTED.findall(text)}


class _WithoutAdvertising(logging.Filter):
    """Lightning logs a tip for a cloud service it sells on every run; it says nothing about the run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("💡 Tip")


def quiet_dependencies() -> None:
    """Silence what the dependencies print about themselves on every run, each by its exact message."""
    # Lightning 2.6.6 flattens loaders with a torch pytree API that torch 2.13 deprecates; not ours to fix
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_WithoutAdvertising())
    # the shipped model_summary section replaces Lightning's default one, as meant; a scheduler that spans
    # the run has Lightning count the steps from the loader: neither is news to anyone
    said = ("Trainer already configured with model summary", "Loading `train_dataloader` to estimate number")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: not record.getMessage().startswith(said)
    )
    # a fit writes into a run folder holding checkpoints only when it resumes from it or was told to
    # (SaveConfig.refusal): Lightning's warning about it is never news
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    # an epoch shorter than log_every_n_steps still logs: StepValues counts optimizer steps across epochs
    warnings.filterwarnings(
        "ignore", message=r"The number of training batches \(\d+\) is smaller than the logging interval"
    )


def main(args: list[str] | None = None, run: bool = True) -> CLI:
    """Run the CLI as a user would; tests call ``main([...])`` with the same words.

    Bad input (a missing file, column or value) ends with one sentence on stderr and exit status 2.
    """
    quiet_dependencies()
    try:
        return CLI(
            model_class=L.LightningModule,  # any: the shipped tasks, or yours as it is
            subclass_mode_model=True,
            datamodule_class=L.LightningDataModule,  # any: a table, images, text, or yours
            subclass_mode_data=True,
            args=args,
            run=run,
            parser_kwargs={name: {"default_config_files": [str(DEFAULTS)]} for name in SUBCOMMANDS}
            if run
            else {"default_config_files": [str(DEFAULTS)]},
            parser_class=Parser,
            save_config_callback=SaveConfig,
            save_config_kwargs={"overwrite": True},
            # one way to set the optimizer and scheduler: model.init_args.optimizer / .scheduler (top-level
            # --optimizer / --lr_scheduler would silently replace them)
            auto_configure_optimizers=False,
        )
    except SIGTERMException as err:
        # stopped from outside; Preemption saved the checkpoint and said where: 128 + SIGTERM, as a shell
        raise SystemExit(128 + signal.SIGTERM) from err
    except Exception as err:
        # jsonargparse wraps errors raised while instantiating; the user's sentence is in the chain
        sentence = user_error(err)
        if sentence is None:
            raise
        print(f"error: {sentence}", file=sys.stderr)
        raise SystemExit(2) from err
