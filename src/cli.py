"""The command line: ``python -m src.cli {fit,validate,test,predict} --config configs/<name>.yaml``;
``configs/defaults.yaml`` first, each ``--config`` over it; a checkpoint carries its run's settings."""

import os
import signal
import sys
import warnings
from pathlib import Path

# jsonargparse 4.53 marks APIs that Lightning 2.6.6 calls deprecated: noise meant for Lightning's maintainers
os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")

from typing import Any

import lightning as L
import yaml
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
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
        # shapes and target names known only to the data; jsonargparse skips a link whose ends are missing
        parser.link_arguments("data.in_features", "model.init_args.in_features", apply_on="instantiate")
        parser.link_arguments("data.out_features", "model.init_args.out_features", apply_on="instantiate")
        parser.link_arguments("data.target_names", "model.init_args.target_names", apply_on="instantiate")
        for section in callback_sections():
            # not add_lightning_class_args, which would hand the Trainer a None for a section set to null
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
            # only a fit acts on the restored checkpoint callbacks' state: their moved folder is no news
            warnings.filterwarnings("ignore", message="The dirpath has changed from")
        settings.check_options(config, self.subcommand)

    @override
    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        """The Trainer with the shipped callbacks, then ``trainer.callbacks``."""
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
            # a fit's last: the run folder's own file, or None (a fresh start), not Lightning's own search
            config["ckpt_path"] = self.config_init[self.subcommand]["ckpt_path"] = resumed
        for callback in self.trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(callback, TakesCommand):
                callback.command = self.typed
        optimizer = getattr(self.model, "optimizer", None)  # the shipped tasks' injected one
        if callable(optimizer):
            # built once now, so a bad argument is one sentence before the run, not a traceback from fit
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
        # first, as the fit's setup writes into the run folder: a refused resume, a folder it may not use
        self.check_resume()
        saver = next((c for c in self.trainer.callbacks if isinstance(c, runs.SaveConfig)), None)  # type: ignore[attr-defined]
        if saver is not None and self.trainer.logger is not None and self.trainer.log_dir is not None:
            refusal = saver.refusal(Path(self.trainer.log_dir))
            if refusal is not None:
                raise UserInputError(refusal)

    def check_resume(self) -> None:
        """The DataModule's refusal of the checkpoint the fit resumes from (read as data)."""
        resumed = self.config_init[self.subcommand].get("ckpt_path")
        if resumed == "last" and self.trainer.log_dir is not None:  # resolved, as Lightning names it
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

    def __init__(
        self,
        *args: Any,
        layer: settings.Layer | None = None,
        subcommands: tuple[str, ...] = SUBCOMMANDS,
        **kwargs: Any,
    ) -> None:
        #: the default config files, with a typed checkpoint's settings (:func:`settings.checkpoint_layer`)
        self.layer = layer or settings.Layer([str(DEFAULTS)])
        self.built = subcommands
        super().__init__(*args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]  # Lightning's is static
        """Lightning's subcommands, those :meth:`__init__` was given: a command builds the parser of the one
        it runs, not all four (each holds every section's arguments)."""
        return {name: skip for name, skip in super().subcommands().items() if name in self.built}

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse the words once, then place the run's logging (:func:`runs.place_logging`)."""
        words = [str(word) for word in (sys.argv[1:] if args is None else args)]
        self.typed = words  # as typed, for advice that repeats the command
        self.config = parser.parse_args(words)
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        ckpt_path, self.resumed_settings = self.layer.ckpt_path, self.layer.resumed
        found = self.config[subcommand].get("ckpt_path")
        if ckpt_path is None and found is not None and settings.is_checkpoint_file(str(found)):
            ckpt_path = str(found)  # named in a config file: checked as a typed one is
            checkpoint = settings.read_checked(ckpt_path, words)
            self.resumed_settings = checkpoint.get("config") if subcommand == "fit" else None
        elif ckpt_path is not None and found is None:
            self.config[subcommand]["ckpt_path"] = ckpt_path  # a config's `ckpt_path: null` keeps it
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
    """Run the CLI on ``args`` as a user would; bad input ends with one sentence on stderr and exit 2."""
    quiet_dependencies()
    if "" in sys.path:
        sys.path[sys.path.index("")] = os.getcwd()  # "" would follow the parser into a config's folder
    words = [str(word) for word in (sys.argv[1:] if args is None else args)]
    # the subcommand typed comes before any value (Lightning's parser takes no other word first); none
    # typed (--help, a misspelt one): every one, so that the parser lists them
    typed = next((word for word in words if word in SUBCOMMANDS), None)
    built = SUBCOMMANDS if typed is None else (typed,)
    try:
        with settings.checkpoint_layer(words) as layer:
            defaults = {"default_config_files": [str(DEFAULTS)]}
            # the checkpoint's settings are a layer of the subcommand that names it alone
            kwargs = {
                name: {"default_config_files": layer.files} if name in words else defaults for name in built
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
                auto_configure_optimizers=False,  # a top-level --optimizer would replace the model's
                layer=layer,
                subcommands=built,
            )
    except SIGTERMException as err:
        # stopped from outside, which saved and said where: its status, else a shell's 128 + SIGTERM
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
