"""Which settings a run gets, in layers, the later winning: ``configs/defaults.yaml``, the settings a
checkpoint carries (``--ckpt_path``), each ``--config`` file in order, then the words typed."""

import copy
import functools
import inspect
import tempfile
from collections.abc import Container, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import yaml
from jsonargparse import Namespace
from lightning.pytorch.callbacks import BasePredictionWriter, ModelCheckpoint, ModelSummary, ProgressBar

from src.checkpoints import DOTTED, TRUSTED_PREFIXES, check_names, in_project, load_checkpoint, resolve
from src.cli_errors import check_config_files, check_log_folder
from src.errors import UserInputError, notice
from src.files import check_output

DEFAULTS = Path(__file__).resolve().parent.parent / "configs" / "defaults.yaml"


#: the sections of a run's config that a checkpoint carries: what it takes to rebuild model and data
CARRIED = ("seed_everything", "model", "data")
#: data settings that belong to one invocation, not to the run that made the checkpoint
PER_INVOCATION = ("predict_path", "preprocessing_from", "resplit_on_resume")
#: options whose values are paths, never class names
PATH_OPTIONS = ("--output", "--ckpt_path", "--data.path", "--data.predict_path", "--data.preprocessing_from")

#: what a resumed fit restores from the checkpoint instead of building it from the settings
RESTORED = ("optimizer", "scheduler", "scheduler_interval")


def check_resumable(saved: Any, now: Any, ckpt_path: str) -> None:
    """Refuse a resumed fit whose seed, optimizer or scheduler settings differ from the checkpoint's."""
    if not isinstance(saved, dict) or not isinstance(now, dict):
        return
    seed = saved.get("seed_everything")
    if "seed_everything" in saved and now.get("seed_everything") != seed:
        raise UserInputError(
            f"seed_everything={now.get('seed_everything')!r} differs from {seed!r}, which --ckpt_path "
            f"{ckpt_path} was trained with; a resumed fit continues that run, seeded as it was, so leave "
            "seed_everything out to resume, or start a new fit to train with another seed."
        )
    model, model_now = saved.get("model"), now.get("model")
    if not isinstance(model, dict) or not isinstance(model_now, dict):
        return
    for key in RESTORED:
        before = (model.get("init_args") or {}).get(key)
        after = (model_now.get("init_args") or {}).get(key)
        for where, old, new in differences(before, after, f"model.init_args.{key}"):
            raise UserInputError(
                f"{where}={new!r} differs from {old!r}, which --ckpt_path {ckpt_path} was trained with; "
                "a resumed fit restores its optimizer and schedule as saved, so leave the setting out to "
                "resume, or start a new fit."
            )


def check_kept(given: Any, applied: Any, ckpt_path: str, subcommand: str) -> None:
    """Refuse a model setting (``given``) that the checkpoint's hyperparameters (``applied``) replaced."""
    for where, new, old in differences(plain(given), plain(applied), "model"):
        if new is None:
            continue
        why = "LightningCLI builds a checkpoint's model from the hyperparameters it carries, so leave the "
        why += (
            "setting out to resume, or start a new fit with it."
            if subcommand == "fit"
            else ("setting out, or fit a new model with it.")
        )
        raise UserInputError(
            f"{where}={new!r} differs from {old!r}, which --ckpt_path {ckpt_path} was trained with; {why}"
        )


def differences(old: Any, new: Any, where: str) -> list[tuple[str, Any, Any]]:
    """``(key, old, new)`` per setting that differs between two nested configs; a changed class is one."""
    if isinstance(old, dict) and isinstance(new, dict):
        if old.get("class_path") != new.get("class_path"):
            return [(f"{where}.class_path", old.get("class_path"), new.get("class_path"))]
        keys = [key for key in new if key in old and key != "class_path"]
        return [found for key in keys for found in differences(old[key], new[key], f"{where}.{key}")]
    return [] if old == new else [(where, old, new)]


def plain(value: Any) -> Any:
    """A value as YAML writes it: namespaces as mappings, tuples as lists."""
    if isinstance(value, Namespace):
        value = value.as_dict()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return [plain(item) for item in value] if isinstance(value, list | tuple) else value


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
    """Whether ``--ckpt_path`` names a file (or URL, folder...) rather than ``last``, ``best``, ``hpc``..."""
    return ckpt_path not in ("last", "best", "hpc") and not ckpt_path.startswith("registry")


def carried_settings(
    config: Any, ckpt_path: str, named: Container[str] = (), choices: bool = True
) -> dict[str, Any]:
    """What of a checkpoint's carried config a later run takes: model, data, seed, logger and callback
    sections (:func:`choice_of`), nothing that says where to write; without ``choices``, the run name."""
    config = config if isinstance(config, dict) else {}
    taken = {key: copy.deepcopy(config[key]) for key in CARRIED if key in config}
    trainer = config.get("trainer") if isinstance(config.get("trainer"), dict) else {}
    logger = trainer.get("logger")
    name = (logger.get("init_args") or {}).get("name") if isinstance(logger, dict) else None
    if not choices and isinstance(name, str):
        taken["trainer"] = {"logger": {"init_args": {"name": name}}}
    if choices and "logger" in trainer:
        logger = choice_of("trainer.logger", trainer["logger"], ckpt_path, named)
        if logger is not LEFT_OFF:
            taken["trainer"] = {"logger": logger}
    for section in callback_sections() if choices else ():
        # predict's writer acts only in predict: a fit that had it off says nothing of its predictions
        if section in config and not writes_predictions(section):
            kept = choice_of(section, config[section], ckpt_path, named)
            if kept is not LEFT_OFF:
                taken[section] = kept
    data = taken.setdefault("data", {})
    for key in PER_INVOCATION:
        (data.get("init_args") or {}).pop(key, None)
    found = resolve(data["class_path"]) if isinstance(data.get("class_path"), str) else None
    if isinstance(found, type) and "preprocessing_from" in inspect.signature(found).parameters:
        data.setdefault("init_args", {})["preprocessing_from"] = ckpt_path
    return taken


#: a carried choice that is not taken
LEFT_OFF = object()
#: arguments of a carried logger or callback that say where it writes: the run decides, not the checkpoint
WHERE = ("dirpath", "save_dir", "version", "output_path", "overwrite")


def choice_of(key: str, value: Any, ckpt_path: str, named: Container[str]) -> Any:
    """A carried logger or callback section, trusted and without :data:`WHERE`, else :data:`LEFT_OFF`."""
    name = value.get("class_path") if isinstance(value, dict) else None
    if not isinstance(name, str):
        return copy.deepcopy(value)
    trusted = name in named or name.startswith(TRUSTED_PREFIXES) or in_project(name)
    if not trusted or not isinstance(resolve(name), type):
        why = (
            "code outside this project that a checkpoint does not name by itself"
            if not trusted
            else ("not in this project (an extra taken off?)")
        )
        notice(f"--ckpt_path {ckpt_path}: its run's {key} {name} is {why}; it is left off.")
        return LEFT_OFF
    kept = copy.deepcopy(value)
    for argument in WHERE:
        (kept.get("init_args") or {}).pop(argument, None)
    return kept


@functools.cache
def writes_predictions(section: str) -> bool:
    """Whether ``configs/defaults.yaml``'s ``section`` is a prediction writer (Lightning's kind)."""
    value = defaults_of(DEFAULTS).get(section) if section in callback_sections() else None
    found = resolve(value["class_path"]) if isinstance(value, dict) else None
    return isinstance(found, type) and issubclass(found, BasePredictionWriter)


def core_settings(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``checkpoint`` without its logger and callback sections (:func:`carried_settings` judges those)."""
    config = checkpoint.get("config")
    if not isinstance(config, dict):
        return checkpoint
    kept = {key: value for key, value in config.items() if key not in callback_sections()}
    if isinstance(kept.get("trainer"), dict):
        kept["trainer"] = {key: value for key, value in kept["trainer"].items() if key != "logger"}
    return {**checkpoint, "config": kept}


def config_files(words: list[str]) -> list[str]:
    """The config files ``words`` give with ``--config`` (not inline YAML), after the defaults."""
    given = [
        words[i + 1] if word in ("--config", "-c") else word.split("=", 1)[1]
        for i, word in enumerate(words)
        if (word in ("--config", "-c") and i + 1 < len(words)) or word.startswith("--config=")
    ]
    return [str(DEFAULTS), *(value for value in given if "\n" not in value and Path(value).is_file())]


class NamedByUser:
    """The dotted names the user wrote, in the words and ``--config`` files; read only when first asked."""

    def __init__(self, words: list[str]) -> None:
        self.words = words
        self.names: set[str] | None = None

    def __contains__(self, name: object) -> bool:
        if self.names is None:
            words = self.words
            # a file (``model.ckpt``) or a path option's value names no class, whatever its dots
            values = [
                word.split("=", 1)[-1]
                for i, word in enumerate(words)
                if not word.startswith(PATH_OPTIONS) and (i == 0 or words[i - 1] not in PATH_OPTIONS)
            ]
            texts = [value for value in values if "\n" not in value and not Path(value).exists()]
            texts += [Path(file).read_text(errors="replace") for file in config_files(words)]
            self.names = {found for text in texts for found in DOTTED.findall(text)}
        return name in self.names


#: top-level keys of a config that are LightningCLI's own, never a callback section
OWN_KEYS = ("seed_everything", "trainer", "model", "data", "optimizer", "lr_scheduler", "ckpt_path")


@functools.cache
def defaults_of(defaults: Path = DEFAULTS) -> dict[str, Any]:
    """``configs/defaults.yaml`` as loaded, read once per process (not to be changed by its readers)."""
    return yaml.safe_load(defaults.read_text()) or {}


@functools.cache
def callback_sections(defaults: Path = DEFAULTS) -> list[str]:
    """The keys of ``configs/defaults.yaml`` that are one callback each (a class, or ``null``)."""
    loaded = defaults_of(defaults)
    return [
        key
        for key, value in loaded.items()
        if key not in OWN_KEYS and (value is None or (isinstance(value, dict) and "class_path" in value))
    ]


@runtime_checkable
class TakesCommand(Protocol):
    """A callback that repeats the run's command in its advice (how to resume); the CLI gives it the words."""

    command: list[str] | None


def check_options(config: Any, subcommand: str) -> None:
    """Refuse options that do not belong to the subcommand or cannot do what they say."""
    if config.get("weights_only") is False:
        raise UserInputError(
            "--weights_only=false would let a checkpoint run code as it loads; checkpoints are read as "
            "tensors and plain data only here, so leave it out."
        )
    config["weights_only"] = True  # for Lightning's own restore too, through any checkpoint plugin
    if config.get("output") and subcommand != "predict":
        raise UserInputError(f"--output belongs to predict, not to {subcommand}.")
    if config.get("overwrite") and subcommand not in ("fit", "predict"):
        raise UserInputError(f"--overwrite belongs to fit and predict, not to {subcommand}.")
    if config.get("output") is not None:
        data = (config.get("data") or {}).get("init_args") or {}
        inputs = [data.get("path"), data.get("predict_path"), data.get("preprocessing_from")]
        files = [str(DEFAULTS), *(str(file) for file in config.get("config") or [])]
        check_output(
            config["output"],
            [*inputs, config.get("ckpt_path"), *files],
            overwrite=bool(config.get("overwrite")),
        )
    if config.get("test_after_fit") and subcommand != "fit":
        raise UserInputError(f"--test_after_fit belongs to fit, not to {subcommand}.")
    trainer = config.get("trainer") or {}
    if subcommand == "fit" and (trainer.get("max_epochs") == 0 or trainer.get("max_steps") == 0):
        raise UserInputError(
            "trainer.max_epochs=0 (or max_steps=0) trains nothing; give at least 1, or -1 for no limit."
        )
    logger = trainer.get("logger")
    if isinstance(logger, dict | type(config)) and logger.get("init_args"):
        check_log_folder(logger["init_args"].get("save_dir"))


SUBCOMMANDS = ("fit", "validate", "test", "predict")


@dataclass
class Layer:
    """The config files read before ``--config`` ones: the defaults, then a typed checkpoint's settings."""

    files: list[str]
    #: the checkpoint file typed as ``--ckpt_path``, else ``None``
    ckpt_path: str | None = None
    #: the config the checkpoint a ``fit`` resumes from carries
    resumed: Any = None


@contextmanager
def checkpoint_layer(words: list[str]) -> Iterator[Layer]:
    """The :class:`Layer` of ``words``: a typed checkpoint's settings in a file while the command runs."""
    check_config_files(words)
    subcommand = next((word for word in words if word in SUBCOMMANDS), None)
    typed = option_value(words, "--ckpt_path")
    if subcommand is None or typed is None or not is_checkpoint_file(typed):
        yield Layer([str(DEFAULTS)])
        return
    checkpoint = read_checked(typed, words)
    resumed = checkpoint.get("config") if subcommand == "fit" else None
    with tempfile.TemporaryDirectory(prefix="checkpoint-settings-") as folder:
        carried = Path(folder) / "carried.yaml"
        layer = carried_settings(checkpoint.get("config"), typed, NamedByUser(words), subcommand != "fit")
        carried.write_text(yaml.safe_dump(layer))
        yield Layer([str(DEFAULTS), str(carried)], typed, resumed)


def read_checked(ckpt_path: str, words: list[str]) -> dict[str, Any]:
    """The checkpoint, read as data, refused if it names code neither trusted nor named in ``words``."""
    checkpoint = load_checkpoint(ckpt_path)
    check_names(core_settings(checkpoint), ckpt_path, NamedByUser(words))
    return checkpoint


def shipped_callbacks(config: Any, subcommand: str | None) -> list[Any]:
    """The callbacks of the sections on, less those the subcommand or ``trainer.enable_*=false`` drops."""
    trainer = config.get("trainer") or {}
    off: list[type] = [] if subcommand in (None, "predict") else [BasePredictionWriter]
    off += [ModelCheckpoint] if trainer.get("enable_checkpointing") is False else []
    off += [ProgressBar] if trainer.get("enable_progress_bar") is False else []
    off += [ModelSummary] if trainer.get("enable_model_summary") is False else []
    on = [config[section] for section in callback_sections() if config.get(section) is not None]
    return [callback for callback in on if not isinstance(callback, tuple(off))]
