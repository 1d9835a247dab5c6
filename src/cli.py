"""The command line: ``python -m src.cli {fit,validate,test,predict} --config configs/<name>.yaml``.

``configs/defaults.yaml`` is read first; each ``--config`` after it overrides it, the later winning
(``--print_config`` shows the result). A checkpoint carries its run's settings and fitted preprocessing,
so ``validate``, ``test`` and ``predict`` need nothing but ``--ckpt_path`` (a ``--config`` still wins).
"""

import os
import signal
import sys
import warnings
from pathlib import Path

# Lightning 2.6.6 calls jsonargparse APIs that jsonargparse 4.53 marks deprecated; the notice is meant
# for Lightning's maintainers and only adds noise to every run here.
os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")

from typing import Any

import lightning as L
import yaml
from lightning.pytorch.callbacks import (
    Callback,
    ModelCheckpoint,
)
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from src import runs, settings
from src.callbacks import PredictionWriter
from src.checkpoints import read_data
from src.cli_errors import Parser, as_command, check_fits, lost_process, quiet_dependencies, user_error
from src.data.loading import ResumableDataModule
from src.errors import UserInputError
from src.settings import DEFAULTS, SUBCOMMANDS, TakesCommand, callback_sections


class CLI(LightningCLI):
    """LightningCLI with the data's shapes linked into the model and an optional test after fit."""

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # shapes known only to the data reach the model where its constructor asks for them
        parser.link_arguments("data.in_features", "model.init_args.in_features", apply_on="instantiate")
        parser.link_arguments("data.out_features", "model.init_args.out_features", apply_on="instantiate")
        # several targets (None for one): whether out_features counts labels or classes, and their names;
        # jsonargparse leaves the link out for a DataModule without the attribute or a model without the
        # argument, as it does the two above
        parser.link_arguments("data.target_names", "model.init_args.target_names", apply_on="instantiate")
        for section in callback_sections():
            # not add_lightning_class_args: its callback keys would hand the Trainer a None for a section
            # set to null; instantiate_trainer gives it the sections that are on instead
            parser.add_subclass_arguments(
                Callback,
                section,
                required=False,
                fail_untyped=False,
                help=f"The callback of configs/defaults.yaml's {section} section; null: off.",
            )
        parser.add_argument(
            "--test_after_fit", type=bool, default=False,
            help="After fit, run test on the best checkpoint and print the test metrics (fit only).",
        )  # fmt: skip
        parser.add_argument(
            "--output", type=str | None, default=None,
            help="Where predict writes its CSV file; left out, predictions.csv beside the checkpoint's run.",
        )  # fmt: skip
        parser.add_argument(
            "--overwrite", type=bool, default=False,
            help="predict: replace an existing file at --output (never one of the run's inputs); fit: write "
            "into a run folder that holds another run's checkpoints.",
        )  # fmt: skip

    @override
    def before_instantiate_classes(self) -> None:
        if self.subcommand is None:  # main(run=False): the classes alone, no subcommand to check
            return
        config = self.config[self.subcommand]
        if self.parsed_model is not None:
            settings.check_kept(self.parsed_model, config["model"], config["ckpt_path"], self.subcommand)
        if isinstance(self.resumed_settings, dict):
            dumped = yaml.safe_load(self.parser.dump(self.config, skip_none=False))[self.subcommand]
            settings.check_resumable(self.resumed_settings, dumped, config["ckpt_path"])
        if self.subcommand != "fit":
            # an evaluation restores the checkpoint callbacks' state, which only a fit acts on: the notice
            # that their folder changed (the checkpoint was moved, or is evaluated from elsewhere) is no news
            warnings.filterwarnings("ignore", message="The dirpath has changed from")
        settings.check_options(config, self.subcommand)

    @override
    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        """The Trainer with the shipped callbacks (:func:`settings.shipped_callbacks`), then
        ``trainer.callbacks``."""
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        trainer = config.get("trainer") or {}
        shipped = settings.shipped_callbacks(config, self.subcommand)
        own = trainer.get("callbacks") or []  # a list, or one callback: the Trainer takes either
        return super().instantiate_trainer(
            **{"callbacks": [*shipped, *(own if isinstance(own, list) else [own])], **kwargs}
        )

    @override
    def after_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        resumed = runs.prepare_folder(self.trainer, config, self.subcommand)
        if resumed != config.get("ckpt_path"):
            # --ckpt_path last: the run folder's own file, or None (a fresh start), for every check and
            # for the fit alike (Lightning's own search for "last" might pick another)
            config["ckpt_path"] = self.config_init[self.subcommand]["ckpt_path"] = resumed
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
        # before the Trainer starts the fit, whose setup already writes into the run folder (config.yaml,
        # a TensorBoard event file): a resume the data refuses, and a folder the run may not write into
        self.check_resume()
        saver = next((c for c in self.trainer.callbacks if isinstance(c, runs.SaveConfig)), None)  # type: ignore[attr-defined]
        if saver is not None and self.trainer.logger is not None and self.trainer.log_dir is not None:
            refusal = saver.refusal(Path(self.trainer.log_dir))
            if refusal is not None:
                raise UserInputError(refusal)

    def check_resume(self) -> None:
        """The DataModule's refusal (:meth:`ResumableDataModule.check_resume`) of the checkpoint the fit
        resumes from (read as data, as Lightning reads it after)."""
        resumed = self.config_init[self.subcommand].get("ckpt_path")
        if resumed == "last" and self.trainer.log_dir is not None:  # the run folder's own (check_last)
            # resolved, as Lightning's own search for it names it
            resumed = str(Path(self.trainer.log_dir).resolve() / "checkpoints" / "last.ckpt")
        if resumed is None or not Path(resumed).is_file():
            return
        checkpoint = read_data(resumed)
        if isinstance(checkpoint, dict) and isinstance(checkpoint.get("state_dict"), dict):
            check_fits(checkpoint["state_dict"], self.model)  # the data's shapes, linked into the model
        if not isinstance(self.datamodule, ResumableDataModule):
            return
        state = checkpoint.get(type(self.datamodule).__qualname__) if isinstance(checkpoint, dict) else None
        if isinstance(state, dict):  # where Lightning keeps a DataModule's state_dict
            self.datamodule.check_resume(state)
            self.datamodule.resume_checked = True
            self.datamodule.check_resumed_batching(state, self.trainer.num_devices * self.trainer.num_nodes)

    def __init__(self, *args: Any, layer: settings.Layer | None = None, **kwargs: Any) -> None:
        #: the default config files, with a typed checkpoint's settings (:func:`settings.checkpoint_layer`)
        self.layer = layer or settings.Layer([str(DEFAULTS)])
        super().__init__(*args, **kwargs)

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse the words once, then place the run's logging (:func:`runs.place_logging`)."""
        words = [str(word) for word in (sys.argv[1:] if args is None else args)]
        #: the words as typed, for advice that repeats the command
        self.typed = words
        self.config = parser.parse_args(words)
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        ckpt_path, self.resumed_settings = self.layer.ckpt_path, self.layer.resumed
        found = self.config[subcommand].get("ckpt_path")
        if ckpt_path is None and found is not None and settings.is_checkpoint_file(str(found)):
            # named in a config file: read and trusted as a typed one is, before LightningCLI applies the
            # model hyperparameters it carries; its settings are that file's
            ckpt_path = str(found)
            checkpoint = settings.read_checked(ckpt_path, words)
            self.resumed_settings = checkpoint.get("config") if subcommand == "fit" else None
        elif ckpt_path is not None and found is None:
            # a config file's `ckpt_path: null` (every saved run config has one) does not undo a typed path
            self.config[subcommand]["ckpt_path"] = ckpt_path
        if ckpt_path is not None:
            runs.place_logging(self.config[subcommand], subcommand, ckpt_path, words)
            #: the model as parsed, which LightningCLI then rebuilds from the checkpoint's hyperparameters
            self.parsed_model = self.config[subcommand]["model"].clone()

    parsed_model: Any = None
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
    words = [str(word) for word in (sys.argv[1:] if args is None else args)]
    try:
        with settings.checkpoint_layer(words) as layer:
            defaults = {"default_config_files": [str(DEFAULTS)]}
            # the checkpoint's settings are a layer of the subcommand that names it alone
            kwargs = {
                name: {"default_config_files": layer.files} if name in words else defaults
                for name in SUBCOMMANDS
            }
            return CLI(
                model_class=L.LightningModule,  # any: the shipped tasks, or yours as it is
                subclass_mode_model=True,
                datamodule_class=L.LightningDataModule,  # any: a table, images, text, or yours
                subclass_mode_data=True,
                args=words,
                run=run,
                parser_kwargs=kwargs if run else defaults,
                parser_class=Parser,
                save_config_callback=runs.SaveConfig,
                save_config_kwargs={"overwrite": True},
                # one way to set the optimizer and scheduler: model.init_args.optimizer / .scheduler
                # (top-level --optimizer / --lr_scheduler would silently replace them)
                auto_configure_optimizers=False,
                layer=layer,
            )
    except SIGTERMException as err:
        # stopped from outside (whoever stopped it saved and said where): the status it gave, else a
        # shell's for SIGTERM (128 + SIGTERM)
        raise SystemExit(err.code if isinstance(err.code, int) else 128 + signal.SIGTERM) from err
    except Exception as err:
        lost = lost_process(err)
        if lost is not None:  # not bad input: the run could not go on, so 1 rather than 2
            print(f"error: {lost}", file=sys.stderr, flush=True)
            raise SystemExit(1) from err
        # jsonargparse wraps errors raised while instantiating; the user's sentence is in the chain
        sentence = user_error(err)
        if sentence is None:
            raise
        print(f"error: {sentence}", file=sys.stderr)
        raise SystemExit(2) from err


if __name__ == "__main__":
    as_command(main)
