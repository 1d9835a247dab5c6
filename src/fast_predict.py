"""``python -m src.cli predict`` on a table's checkpoint, without Lightning: the same file, in half the time.

Predicting rows of a table needs the checkpoint's fitted preprocessing, its net and the task's rule for
outputs; it needs neither the Trainer nor its loggers, and importing Lightning alone takes longer than all
the rest (about 2 s of 4.5 on a quiet 2-core machine, ``benchmarks/predict_cli.py``). So ``src/cli.py``
hands this module the words

    predict --ckpt_path CKPT --data.predict_path FILE [--output OUT] [--overwrite true|false]

when the checkpoint was made by a shipped task (``Classifier``, ``Regressor``) on the shipped table
DataModule; any other word, or any other checkpoint (images, text, a LightningModule or DataModule of
yours), goes to the full CLI, which predicts under the Trainer as before. What is written is the same file
byte for byte (``tests/test_fast_predict.py`` holds the two paths equal): the same reading of the file, the
same preprocessing, batches of the run's ``data.batch_size`` through the net in eval mode on the CPU with
the shipped ``cpu_threads`` setting, the task's own output rule, the same CSV writer. Nothing else is
written: no run folder beside the checkpoint, no TensorBoard run.
"""

import sys
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import yaml
from torch import nn

from src.checkpoints import check_names, load_checkpoint, resolve
from src.data import sources
from src.data.preprocessing import preprocessing_of
from src.errors import UserInputError
from src.files import check_output, written
from src.nets import DEFAULT_NET
from src.predict import beside_the_run, prediction_frame

DEFAULTS = Path(__file__).resolve().parent.parent / "configs" / "defaults.yaml"
#: the words this path takes, each once at most; anything else goes to the full CLI
OPTIONS = ("--ckpt_path", "--data.predict_path", "--output", "--overwrite")
#: the tasks whose output rule is known here, by the class path a checkpoint names them with
TASKS = {
    "src.models.Classifier": "classification",
    "src.models.classifier.Classifier": "classification",
    "src.models.Regressor": "regression",
    "src.models.regressor.Regressor": "regression",
}
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


def task_of(checkpoint: dict[str, Any]) -> str | None:
    """``classification`` or ``regression`` for a checkpoint of a shipped task on the table DataModule;
    ``None`` for any other, which the full CLI predicts from."""
    config = checkpoint.get("config")
    data = config.get("data") if isinstance(config, dict) else None
    data_class = data.get("class_path") if isinstance(data, dict) else None
    hparams = checkpoint.get("hyper_parameters")
    if data_class not in TABLES or not isinstance(hparams, dict) or "TabularDataModule" not in checkpoint:
        return None
    return TASKS.get(str(hparams.get("_class_path")))


def net_of(checkpoint: dict[str, Any], path: str) -> nn.Module:
    """The task's net, rebuilt from its config (as the task's ``__init__`` builds it) and its weights."""
    hparams = checkpoint["hyper_parameters"]
    spec = hparams.get("net") or DEFAULT_NET
    net_class = resolve(spec["class_path"])  # a trusted name (check_names), or one of an imported class
    if not isinstance(net_class, type):
        raise UserInputError(
            f"checkpoint {path!r} names {spec['class_path']!r} (at hyper_parameters.net.class_path), "
            "which is not a class of this project or its libraries; it was made by other code, or is damaged."
        )
    net = net_class(hparams["in_features"], hparams["out_features"], **(spec.get("init_args") or {}))
    weights = {k.removeprefix("net."): v for k, v in checkpoint["state_dict"].items() if k.startswith("net.")}
    net.load_state_dict(weights)
    return net.eval()


def outputs_of(
    net: nn.Module, x: torch.Tensor, task: str, state: dict[str, torch.Tensor], batch_size: int
) -> dict[str, torch.Tensor]:
    """``predict_step``'s outputs of the shipped tasks, batch by batch as the Trainer feeds them:
    ``Classifier``: softmax of the logits and their argmax; ``Regressor``: the net's output in the target's
    units."""
    parts: list[dict[str, torch.Tensor]] = []
    with torch.inference_mode():
        for batch in x.split(batch_size):
            output = net(batch)
            if task == "classification":
                probs = output.softmax(dim=-1)
                parts.append({"probs": probs, "preds": probs.argmax(dim=-1)})
            else:
                values = output.squeeze(-1) * state["target_std"] + state["target_mean"]
                learnt_log = state.get("target_log", torch.tensor(0.0)) > 0  # the Regressor's log(1 + y)
                parts.append({"preds": torch.where(learnt_log, torch.expm1(values), values)})
    return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}


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
    # nothing the checkpoint names is imported but its net (src.nets.MLP, say), and no untrusted name passes
    check_names(checkpoint, ckpt_path, set(), import_trusted=False)
    task = task_of(checkpoint)
    if task is None:
        return False
    net = net_of(checkpoint, ckpt_path)
    data = checkpoint["config"]["data"].get("init_args") or {}
    path = given["--data.predict_path"]
    output = given.get("--output")
    overwrite = given.get("--overwrite", "false").lower() == "true"
    if output is not None:  # as the full CLI: refused before anything is read
        check_output(output, [path, ckpt_path, str(DEFAULTS)], overwrite)
    sources.check_predict_path(path)
    preprocessor = preprocessing_of(checkpoint, ckpt_path)
    fmt = sources.file_format(path)
    frame = sources.read_file(path, fmt, data.get("na_values") or [], key="data.predict_path")
    x = torch.from_numpy(preprocessor.transform(frame, sources.file_location(path, fmt)))
    threads, before = cpu_threads(), torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        outputs = outputs_of(net, x, task, checkpoint["state_dict"], data.get("batch_size", 32))
    finally:
        torch.set_num_threads(before)
    rows = prediction_frame(outputs, preprocessor.labels, pd.Index(frame.index.to_numpy(), name="row"))
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
