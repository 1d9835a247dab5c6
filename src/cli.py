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
from src.errors import UserInputError
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
            help="Let predict replace an existing file at its output path (never one of the run's inputs).",
        )

    @override
    def before_instantiate_classes(self) -> None:
        if self.subcommand is None:  # main(run=False): the classes alone, no subcommand to check
            return
        config = self.config[self.subcommand]
        if self.subcommand != "fit":
            # an evaluation restores the checkpoint callbacks' state, which only a fit acts on: the notice
            # that their folder changed (the checkpoint was moved, or is evaluated from elsewhere) is no news
            warnings.filterwarnings("ignore", message="The dirpath has changed from")
        for option in ("output", "overwrite"):
            if config.get(option) and self.subcommand != "predict":
                raise UserInputError(f"--{option} belongs to predict, not to {self.subcommand}.")
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

    def after_predict(self) -> None:
        for callback in self.trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(callback, PredictionWriter) and callback.written is not None:
                print(f"Predictions for {callback.rows_written} rows written to {callback.written}")

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        # LightningCLI next applies a checkpoint's hyperparameters, importing every class they name; a
        # ckpt_path from a config file reaches it without passing with_checkpoint_settings, so its names
        # are checked here, after parsing and before anything the checkpoint names is imported
        config = self.config.get(self.config.get("subcommand") or "", self.config)
        ckpt_path = config.get("ckpt_path") if hasattr(config, "get") else None
        if ckpt_path and ("://" in str(ckpt_path) or Path(ckpt_path).is_file()):  # a URL: one sentence
            words = sys.argv[1:] if args is None else [str(word) for word in args]
            check_names(load_checkpoint(ckpt_path), ckpt_path, user_named(words))

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


def _value(words: list[str], key: str) -> str | None:
    """The value given to ``--key`` as ``--key value`` or ``--key=value``, the last one winning."""
    found = None
    for i, word in enumerate(words):
        if word == key and i + 1 < len(words):
            found = words[i + 1]
        elif word.startswith(key + "="):
            found = word[len(key) + 1 :]
    return found


def with_checkpoint_settings(words: list[str]) -> list[str]:
    """The words, completed from ``--ckpt_path``'s checkpoint when it is a file.

    The data reuses the checkpoint's fitted preprocessing (``--data.preprocessing_from``), and
    ``validate``/``test``/``predict`` without any ``--config`` or ``--model`` take the run's own model and
    data settings from the checkpoint, as a first ``--config`` that later words override.
    """
    if not words or words[0] not in SUBCOMMANDS:
        return words
    ckpt_path = _value(words, "--ckpt_path")
    if ckpt_path is None or ckpt_path in ("last", "best", "hpc", "registry"):
        return words
    # one sentence for a URL (Lightning would load it with weights_only=False), a missing, broken or
    # unsafe file; what passes is then loaded by Lightning as data only
    checkpoint = load_checkpoint(ckpt_path)
    # what the checkpoint names is imported when its settings are parsed: not on the checkpoint's word
    check_names(checkpoint, ckpt_path, user_named(words))
    extra: list[str] = []
    configured = any(w in ("--config", "-c") or w.startswith(("--config=", "--model")) for w in words)
    if words[0] != "fit" and not configured and "config" in checkpoint:
        extra = ["--config", yaml.safe_dump(carried_settings(checkpoint["config"]))]
    if _value(words, "--data.preprocessing_from") is None and _takes_preprocessing_from(checkpoint):
        words = [*words, f"--data.preprocessing_from={ckpt_path}"]
    if words[0] == "predict" and not any(w.startswith("--trainer.logger") for w in words):
        words = [*words, "--trainer.logger=false"]  # predict logs nothing: no run folder for it
    elif words[0] != "fit" and not any(w.startswith("--trainer.logger") for w in words):
        words = [*words, *_log_with_the_run(words[0], Path(ckpt_path), checkpoint)]
    return [words[0], *extra, *words[1:]]


def _takes_preprocessing_from(checkpoint: dict[str, Any]) -> bool:
    """Whether the DataModule class the checkpoint's run used (the table's, for a checkpoint that names
    none) reads its fitted state from a checkpoint: the shipped ones do, a DataModule of yours may not."""
    data = (checkpoint.get("config") or {}).get("data") or {}
    class_path = data.get("class_path") if isinstance(data, dict) else None
    found = resolve(class_path) if isinstance(class_path, str) else TabularDataModule
    return isinstance(found, type) and "preprocessing_from" in inspect.signature(found).parameters


def carried_settings(config: Any) -> dict[str, Any]:
    """What of a checkpoint's carried config a later run takes: what :class:`SaveConfig` writes there (the
    model, the data, the seed) and the logger's run name, and nothing else a file from elsewhere could add
    (callbacks, an output path, a logger writing to a folder of its choosing)."""
    if not isinstance(config, dict):
        return {}
    taken = {key: config[key] for key in CARRIED if key in config}
    logger = (config.get("trainer") or {}).get("logger") if isinstance(config.get("trainer"), dict) else None
    name = (logger.get("init_args") or {}).get("name") if isinstance(logger, dict) else None
    if isinstance(name, str):
        taken["trainer"] = {"logger": {"init_args": {"name": name}}}
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


def _log_with_the_run(subcommand: str, ckpt_path: Path, checkpoint: dict[str, Any]) -> list[str]:
    """Logger words that put an evaluation of ``<save_dir>/<name>/<version>/checkpoints/x.ckpt`` into a
    folder inside that run, ``<version>/<subcommand>-x``, beside its training curves: TensorBoard shows
    it as a run of its own, and repeating it adds no ``version_N``."""
    run = ckpt_path.resolve().parent.parent
    logger = checkpoint.get("config", {}).get("trainer", {}).get("logger")
    tensorboard = isinstance(logger, dict) and str(logger.get("class_path", "")).endswith("TensorBoardLogger")
    if (
        ckpt_path.resolve().parent.name != "checkpoints"
        or not (run / "config.yaml").is_file()
        or not tensorboard
    ):
        return []
    return [
        f"--trainer.logger.init_args.save_dir={run.parent.parent}",
        f"--trainer.logger.init_args.name={run.parent.name}",
        f"--trainer.logger.init_args.version={run.name}/{subcommand}-{ckpt_path.stem}",
    ]


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
        if run:
            if args is None:
                # completed in place, so that processes Lightning launches (DDP) read the same words
                sys.argv[1:] = with_checkpoint_settings(sys.argv[1:])
            else:
                args = with_checkpoint_settings(list(args))
            check_config_files(sys.argv[1:] if args is None else args)
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
