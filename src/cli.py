"""The command line: ``python -m src.cli {fit,validate,test,predict} --config configs/<name>.yaml``.

``configs/defaults.yaml`` is read first by every subcommand; each ``--config`` after it overrides it,
and the later of several ``--config`` wins. ``--print_config`` shows the merged result.

A checkpoint carries its run's model and data settings and the fitted preprocessing, so
``validate``, ``test`` and ``predict`` need nothing but ``--ckpt_path`` (a ``--config`` still wins):

    python -m src.cli predict --ckpt_path CKPT --data.predict_path new.csv --output predictions.csv
"""

import logging
import os
import signal
import sys
import threading
import warnings
from pathlib import Path

# Lightning 2.6.6 calls jsonargparse APIs that jsonargparse 4.53 marks deprecated; the notice is meant
# for Lightning's maintainers and only adds noise to every run here.
os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")

from typing import Any, Protocol, runtime_checkable

import lightning as L
import yaml
from jsonargparse import Namespace
from lightning.pytorch.callbacks import (
    BasePredictionWriter,
    Callback,
    ModelCheckpoint,
    ModelSummary,
)
from lightning.pytorch.callbacks import ProgressBar as LightningProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from src import runs, settings
from src.callbacks import PredictionWriter
from src.checkpoints import check_names, load_checkpoint
from src.cli_errors import Parser, check_config_files, check_log_folder, user_error
from src.errors import UserInputError, notice
from src.files import check_output
from src.settings import DEFAULTS

SUBCOMMANDS = ("fit", "validate", "test", "predict")
#: top-level keys of a config that are LightningCLI's own, never a callback section
OWN_KEYS = ("seed_everything", "trainer", "model", "data", "optimizer", "lr_scheduler", "ckpt_path")


def callback_sections(defaults: Path = DEFAULTS) -> list[str]:
    """The callback sections: each top-level key of ``configs/defaults.yaml`` that names a class (or is
    ``null``) and is not LightningCLI's own, in the file's order.

    A section is one callback a later config changes one setting of (``early_stopping: {init_args:
    {patience: 5}}``) without repeating the others, or switches off with ``null``; ``trainer.callbacks``
    holds the user's own. Removing a section from the defaults removes it from every run.
    """
    loaded = yaml.safe_load(defaults.read_text()) or {}
    return [
        key
        for key, value in loaded.items()
        if key not in OWN_KEYS and (value is None or (isinstance(value, dict) and "class_path" in value))
    ]


@runtime_checkable
class TakesCommand(Protocol):
    """A callback that repeats the run's command in its advice (how to resume); the CLI gives it the words."""

    command: list[str] | None


class CLI(LightningCLI):
    """LightningCLI with the data's shapes linked into the model and an optional test after fit."""

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # shapes known only to the data reach the model here, where its constructor asks for them (a
        # module without such an argument is built without it); nobody types them twice
        parser.link_arguments("data.in_features", "model.init_args.in_features", apply_on="instantiate")
        parser.link_arguments("data.out_features", "model.init_args.out_features", apply_on="instantiate")
        for section in callback_sections():
            # add_lightning_class_args(subclass_mode=True, required=False) but for one thing: no entry in
            # LightningCLI's callback keys, which would hand the Trainer a None for a section set to null;
            # instantiate_trainer gives it the sections that are on instead
            parser.add_subclass_arguments(
                Callback,
                section,
                required=False,
                fail_untyped=False,
                help=f"The callback of configs/defaults.yaml's {section} section; null: off.",
            )
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
            settings.check_resumable(self.resumed_settings, dumped, config["ckpt_path"])
        if self.subcommand != "fit":
            # an evaluation restores the checkpoint callbacks' state, which only a fit acts on: the notice
            # that their folder changed (the checkpoint was moved, or is evaluated from elsewhere) is no news
            warnings.filterwarnings("ignore", message="The dirpath has changed from")
        if config.get("weights_only") is False:
            raise UserInputError(
                "--weights_only=false would let a checkpoint run code as it loads; checkpoints are read as "
                "tensors and plain data only here, so leave it out."
            )
        # Lightning's own restore reads the checkpoint too, through whatever checkpoint plugin is in use
        config["weights_only"] = True
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

        A subcommand other than predict leaves out the prediction writer;
        ``trainer.enable_checkpointing=false`` leaves out the sections that are ModelCheckpoints, and
        ``trainer.enable_progress_bar=false`` the progress bar, so that each means what it says instead of
        clashing with them (one given in ``trainer.callbacks`` still clashes: the user asked for both).
        """
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        trainer = config.get("trainer") or {}
        shipped = [config[section] for section in callback_sections() if config.get(section) is not None]
        if self.subcommand not in (None, "predict"):
            # a prediction writer acts in predict only: the Trainer calls every callback at each hook of
            # every training step, whether it acts or not
            shipped = [c for c in shipped if not isinstance(c, BasePredictionWriter)]
        if trainer.get("enable_checkpointing") is False:
            shipped = [c for c in shipped if not isinstance(c, ModelCheckpoint)]
        if trainer.get("enable_progress_bar") is False:
            shipped = [c for c in shipped if not isinstance(c, LightningProgressBar)]
        if trainer.get("enable_model_summary") is False:
            shipped = [c for c in shipped if not isinstance(c, ModelSummary)]
        own = trainer.get("callbacks") or []  # a list, or one callback: the Trainer takes either
        return super().instantiate_trainer(
            **{"callbacks": [*shipped, *(own if isinstance(own, list) else [own])], **kwargs}
        )

    @override
    def after_instantiate_classes(self) -> None:
        logger = self.trainer.logger
        saver = next((c for c in self.trainer.callbacks if isinstance(c, runs.SaveConfig)), None)  # type: ignore[attr-defined]
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
                settings.check_last(base, named)
        for callback in self.trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(callback, TakesCommand):
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
        saver = next((c for c in self.trainer.callbacks if isinstance(c, runs.SaveConfig)), None)  # type: ignore[attr-defined]
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
        ckpt_path = settings.option_value(words, "--ckpt_path")
        if ckpt_path is None:  # none typed: one may still come from a config file
            self.config = parser.parse_args([*words, *self.own_defaults(words)[0]])
            found = self.config.get(f"{subcommand}.ckpt_path") if subcommand else None
            ckpt_path = str(found) if found is not None else None
        if subcommand is not None and ckpt_path is not None and settings.is_checkpoint_file(ckpt_path):
            # one sentence for a URL, a missing, broken or unsafe file; and nothing the checkpoint names is
            # imported while it is parsed unless it is trusted or the user named it
            checkpoint = load_checkpoint(ckpt_path)
            check_names(checkpoint, ckpt_path, settings.user_named(words))
            self.resumed_settings = checkpoint.get("config") if subcommand == "fit" else None
            layer = settings.carried_settings(checkpoint.get("config"), ckpt_path)
            self.layer = layer
            at = words.index(subcommand) + 1
            layered = [*words[:at], "--config", yaml.safe_dump(layer), *words[at:]]
            self.config = parser.parse_args([*layered, *self.own_defaults(words)[0]])
            self.place_logging(subcommand, ckpt_path, words)
        elif not hasattr(self, "config"):
            self.config = parser.parse_args([*words, *self.own_defaults(words)[0]])
        typed = settings.option_value(words, "--ckpt_path")
        if (
            subcommand is not None
            and typed is not None
            and self.config.get(f"{subcommand}.ckpt_path") is None
        ):
            # a config file's `ckpt_path: null` (every saved run config has one) does not undo a typed path
            self.config[subcommand]["ckpt_path"] = typed
        for line in self.own_defaults(words)[1]:
            notice(line)
        self.parsed_model = self.config.get(f"{subcommand}.model") if subcommand else None

    def own_defaults(self, words: list[str]) -> tuple[list[str], list[str]]:
        """:func:`settings.own_default_words` for the layers these words and the checkpoint give."""
        layers = settings.layers_of(words, settings.config_files(words), self.layer)
        return settings.own_default_words(layers, words)

    #: the settings of the checkpoint given as ``--ckpt_path``, read below the user's
    layer: dict[str, Any] | None = None

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
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None, weights_only=True)


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
    # the run has Lightning count the steps from the loader: neither is news to anyone; nor which
    # checkpoint was loaded: "Testing the best checkpoint: <path>" has said which
    said = (
        "Trainer already configured with model summary",
        "Loading `train_dataloader` to estimate number",
        "Restoring states from the checkpoint path at",
        "Loaded model weights from the checkpoint at",
    )
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
    if "" in sys.path:
        # the parser reads a config file from inside the file's folder, where "" (the working folder of
        # `python -m`) would then point: a module beside src/ named in a config file (examples.manual,
        # a net of yours) is found from the folder the command was typed in
        sys.path[sys.path.index("")] = os.getcwd()
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
            save_config_callback=runs.SaveConfig,
            save_config_kwargs={"overwrite": True},
            # one way to set the optimizer and scheduler: model.init_args.optimizer / .scheduler (top-level
            # --optimizer / --lr_scheduler would silently replace them)
            auto_configure_optimizers=False,
        )
    except SIGTERMException as err:
        # stopped from outside (a preemption callback saved and said where): 128 + SIGTERM, as a shell
        raise SystemExit(128 + signal.SIGTERM) from err
    except Exception as err:
        # jsonargparse wraps errors raised while instantiating; the user's sentence is in the chain
        sentence = user_error(err)
        if sentence is None:
            raise
        print(f"error: {sentence}", file=sys.stderr)
        raise SystemExit(2) from err


def command() -> None:
    """``python -m src.cli`` and the ``lightning-template`` command: :func:`main` on the shell's words, as
    this process's one run.

    A background thread's error that has a sentence (:func:`user_error`) is kept, not printed with its
    traceback: TensorBoard's event-file writer thread, on a full disk, dies with the error that the fit
    then raises again from the logger. The run ends with one sentence, the fit's own, or the thread's when
    the fit ended without one; a thread's bug keeps its traceback.
    """
    kept: list[str] = []
    report = threading.excepthook

    def keep(args: threading.ExceptHookArgs) -> None:
        sentence = None if args.exc_value is None else user_error(args.exc_value)
        if sentence is None:
            report(args)
        else:
            kept.append(sentence)

    # for the rest of the process, not restored: the dying thread may report after the fit has ended
    threading.excepthook = keep
    main()
    if kept:
        print(f"error: {kept[0]}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    command()
