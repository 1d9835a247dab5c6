"""``python -m src.cli predict`` on a table's checkpoint, without the CLI's machinery: the same file, sooner.

Predicting rows of a table needs the checkpoint's model, its fitted preprocessing and the model's own
``predict_step``; it needs neither the Trainer, its callbacks and loggers, nor the config parser. So
``src/cli.py`` hands this module the words

    predict --ckpt_path CKPT --data.predict_path FILE [--output OUT] [--overwrite true|false]

when the checkpoint was made on the shipped table DataModule (with any LightningModule: the shipped
tasks or yours); any other word, or any other checkpoint (images, text, a DataModule of yours), goes to
the full CLI. This path is :class:`src.predict.Predictor` (the same one Python and the server use) on
the file: the same reading of the file, the same preprocessing, batches of the run's
``data.batch_size`` through the model's ``predict_step`` with the shipped ``cpu_threads`` setting, the
same CSV writer. What is written is the full CLI's file byte for byte (``tests/test_fast_predict.py``);
nothing else is written: no run folder beside the checkpoint, no TensorBoard run.
"""

import sys
from pathlib import Path
from typing import Any

import torch
import yaml

from src.checkpoints import load_checkpoint
from src.data import sources
from src.errors import UserInputError
from src.files import check_output, written
from src.predict import Predictor, beside_the_run

DEFAULTS = Path(__file__).resolve().parent.parent / "configs" / "defaults.yaml"
#: the words this path takes, each once at most; anything else goes to the full CLI
OPTIONS = ("--ckpt_path", "--data.predict_path", "--output", "--overwrite")
TABLES = (None, "src.data.TabularDataModule", "src.data.datamodule.TabularDataModule")


def options(words: list[str]) -> dict[str, str] | None:
    """``predict``'s words as ``{option: value}``, or ``None`` when they hold anything this path does not
    take (the full CLI then reads them, and says what is wrong with them if anything is)."""
    if not words or words[0] != "predict":
        return None
    found: dict[str, str] = {}
    rest = words[1:]
    while rest:
        word, rest = rest[0], rest[1:]
        key, equals, value = word.partition("=")
        if key not in OPTIONS or key in found:
            return None
        if not equals:
            if not rest:
                return None
            value, rest = rest[0], rest[1:]
        found[key] = value
    if found.get("--overwrite", "false").lower() not in ("true", "false"):
        return None
    return found if "--ckpt_path" in found and "--data.predict_path" in found else None


def on_a_table(checkpoint: dict[str, Any]) -> bool:
    """Whether the checkpoint was made on the shipped table DataModule (it carries that DataModule's
    fitted state); any other data goes to the full CLI."""
    config = checkpoint.get("config")
    data = config.get("data") if isinstance(config, dict) else None
    data_class = data.get("class_path") if isinstance(data, dict) else None
    return data_class in TABLES and "TabularDataModule" in checkpoint


def cpu_threads() -> int | None:
    """The shipped ``cpu_threads`` setting of ``configs/defaults.yaml``, which the Trainer path applies."""
    section = yaml.safe_load(DEFAULTS.read_text()).get("cpu_threads") or {}
    return (section.get("init_args") or {}).get("threads", 1) if section else None


def predict(words: list[str]) -> bool:
    """Predict as ``python -m src.cli predict`` does and return ``True``, or return ``False`` (having done
    nothing) when the words or the checkpoint need the full CLI. Bad input raises :class:`UserInputError`."""
    given = options(words)
    if given is None or not Path(given["--ckpt_path"]).is_file():
        return False
    ckpt_path = given["--ckpt_path"]
    checkpoint = load_checkpoint(ckpt_path)  # one sentence for a broken or unsafe file
    if not on_a_table(checkpoint):  # read as plain data: its names are checked as the model is loaded
        return False
    data = checkpoint["config"]["data"].get("init_args") or {}
    path = given["--data.predict_path"]
    output = given.get("--output")
    overwrite = given.get("--overwrite", "false").lower() == "true"
    if output is not None:  # as the full CLI: refused before anything is read
        check_output(output, [path, ckpt_path, str(DEFAULTS)], overwrite)
    sources.check_predict_path(path)
    predictor = Predictor.from_checkpoint(ckpt_path, batch_size=data.get("batch_size", 32))
    fmt = sources.file_format(path)
    na_values = (data.get("columns") or {}).get("na_values") or []
    frame = sources.read_file(path, fmt, na_values, key="data.predict_path")
    threads, before = cpu_threads(), torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        rows = predictor.predict(frame, sources.file_location(path, fmt))
    finally:
        torch.set_num_threads(before)
    if output is None:  # the prediction writer's default
        checked = check_output(
            beside_the_run(ckpt_path), [ckpt_path, path], overwrite, "predict's default output"
        )
    else:
        checked = check_output(output, [ckpt_path, path], overwrite)
    with written(checked) as (partial,):
        rows.to_csv(partial, index=False)
    print(f"Predictions for {len(rows)} rows written to {checked}")
    return True


def main(words: list[str]) -> bool:
    """:func:`predict`, with bad input as one sentence on stderr and exit status 2 (as the full CLI)."""
    try:
        return predict(words)
    except UserInputError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from err
