"""The command line: ``python -m src.cli {fit,validate,test,predict} --config configs/<name>.yaml``.

``configs/defaults.yaml`` is read first by every subcommand; each ``--config`` after it overrides it,
and the later of several ``--config`` wins. ``--print_config`` shows the merged result.
"""

import os
import sys
from pathlib import Path

# Lightning 2.6.6 calls jsonargparse APIs that jsonargparse 4.53 marks deprecated; the notice is meant
# for Lightning's maintainers and only adds noise to every run here.
os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from typing_extensions import override

from src.data import TabularDataModule
from src.errors import UserInputError
from src.models import BaseTask

DEFAULTS = Path(__file__).resolve().parent.parent / "configs" / "defaults.yaml"
SUBCOMMANDS = ("fit", "validate", "test", "predict")


class CLI(LightningCLI):
    """LightningCLI with the data's shapes linked into the model and an optional test after fit."""

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # shapes known only to the data reach the model here; nobody types them twice
        parser.link_arguments("data.in_features", "model.init_args.in_features", apply_on="instantiate")
        parser.link_arguments("data.out_features", "model.init_args.out_features", apply_on="instantiate")
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="After fit, run test on the best checkpoint and print the test metrics (fit only).",
        )

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


def main(args: list[str] | None = None, run: bool = True) -> CLI:
    """Run the CLI as a user would; tests call ``main([...])`` with the same words.

    Bad input (a missing file, column or value) ends with one sentence on stderr and exit status 2.
    """
    try:
        return CLI(
            model_class=BaseTask,
            subclass_mode_model=True,
            datamodule_class=TabularDataModule,
            args=args,
            run=run,
            parser_kwargs={name: {"default_config_files": [str(DEFAULTS)]} for name in SUBCOMMANDS}
            if run
            else {"default_config_files": [str(DEFAULTS)]},
            save_config_kwargs={"overwrite": True},
        )
    except Exception as err:
        # jsonargparse wraps errors raised while instantiating; the user's sentence is in the chain
        cause: BaseException | None = err
        while cause is not None and not isinstance(cause, UserInputError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        print(f"error: {cause}", file=sys.stderr)
        raise SystemExit(2) from err


if __name__ == "__main__":
    main()
