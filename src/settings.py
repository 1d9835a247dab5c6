"""Which settings a run gets: the layers of its config, and what happens when a later layer names another
class than an earlier one.

A run's settings come in layers, the later winning: ``configs/defaults.yaml``, the settings a checkpoint
carries (``--ckpt_path``), each ``--config`` file in order, then the words typed. jsonargparse merges a
later layer's ``class_path`` into an earlier one's arguments: a config that turns AdamW into SGD would
keep AdamW's ``weight_decay`` for SGD without a word. Here a class replaced by one that is not its
subclass starts from its own defaults for every argument the later layer does not give
(:func:`switched_classes`); a subclass keeps them, as a subclass takes its base's arguments.
"""

import copy
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import yaml
from lightning.pytorch.callbacks import BasePredictionWriter, ModelCheckpoint, ModelSummary, ProgressBar

from src.checkpoints import DOTTED, check_names, load_checkpoint, resolve
from src.cli_errors import check_config_files, check_log_folder
from src.errors import UserInputError, notice
from src.files import check_output

DEFAULTS = Path(__file__).resolve().parent.parent / "configs" / "defaults.yaml"

Key = tuple[str, ...]
#: a word that gives a class: ``--model.init_args.optimizer=torch.optim.SGD`` or ``--x.class_path=...``
CLASS_WORD = re.compile(r"--([\w.]+?)(?:\.class_path)?=([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*\.[A-Z]\w*)$")


@dataclass
class Switch:
    """A class replaced by an unrelated one in a later layer, and the arguments earlier layers gave it."""

    before: str
    after: str
    #: argument → the value an earlier layer gave it, which the switching layer does not give again
    carried: dict[str, Any] = field(default_factory=dict)


def classes_in(value: Any, key: Key = ()) -> Iterator[tuple[Key, str | None, dict[str, Any]]]:
    """Every ``(key, class_path, init_args)`` of a nested config: each mapping that names a class, or gives
    a class's ``init_args``; lists (callbacks, plugins) are left out."""
    if not isinstance(value, dict):
        return
    init_args = value.get("init_args")
    if "class_path" in value or isinstance(init_args, dict):
        class_path = value.get("class_path")
        yield key, class_path if isinstance(class_path, str) else None, dict(init_args or {})
        for name, inner in (init_args or {}).items():
            yield from classes_in(inner, (*key, "init_args", name))
        return
    for name, inner in value.items():
        yield from classes_in(inner, (*key, str(name)))


def layers_of(words: list[str], files: list[str], checkpoint_layer: dict[str, Any] | None) -> list[dict]:
    """The config layers in the order they apply: the defaults file, the checkpoint's settings, the other
    config files, each as its mapping (a file that is not YAML counts as empty: the parser says why)."""

    def read(file: str) -> dict[str, Any]:
        try:
            loaded = yaml.safe_load(Path(file).read_text())
        except (OSError, yaml.YAMLError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    return [read(files[0]), checkpoint_layer or {}, *(read(file) for file in files[1:])]


def switched_classes(layers: list[dict[str, Any]], words: list[str]) -> dict[Key, Switch]:
    """Each config key whose class a later layer (or a word) replaced by one that is not its subclass,
    with the arguments the earlier layers gave that the replacing layer does not give again."""
    current: dict[Key, tuple[str, dict[str, Any]]] = {}  # key → (class, arguments given for it so far)
    switches: dict[Key, Switch] = {}
    steps: list[list[tuple[Key, str | None, dict[str, Any]]]] = [list(classes_in(layer)) for layer in layers]
    steps += [[word] for word in words_as_layers(words)]
    for step in steps:
        for key, class_path, given in step:
            before, earlier = current.get(key, (None, {}))
            if class_path is not None and before is not None and not related(before, class_path):
                carried = {name: value for name, value in earlier.items() if name not in given}
                switches[key] = Switch(before, class_path, carried)
                earlier = {}
            elif key in switches:
                for name in given:  # given again after the switch: the user's, not carried
                    switches[key].carried.pop(name, None)
            current[key] = (class_path or before or "", {**earlier, **given})
    return {key: switch for key, switch in switches.items() if switch.carried}


def words_as_layers(words: list[str]) -> Iterator[tuple[Key, str | None, dict[str, Any]]]:
    """The typed words that give a class (``--model.init_args.optimizer=torch.optim.SGD``) or one of its
    arguments (``--model.init_args.optimizer.init_args.lr=0.1``), in the form of :func:`classes_in`."""
    for word in words:
        found = CLASS_WORD.match(word)
        if found:
            yield tuple(found[1].split(".")), found[2], {}
        elif word.startswith("--") and "=" in word and ".init_args." in word:
            path, _, value = word[2:].partition("=")
            owner, _, name = path.rpartition(".init_args.")
            if "." not in name:
                yield tuple(owner.split(".")), None, {name: value}


def related(before: str, after: str) -> bool:
    """Whether ``after`` is ``before`` or a subclass of it (unknown names count as related: nothing to do)."""
    if before == after:
        return True
    old, new = resolve(before), resolve(after)
    return not (isinstance(old, type) and isinstance(new, type)) or issubclass(new, old)


def defaults_of(switch: Switch) -> dict[str, Any]:
    """The replacing class's own defaults for the arguments that were carried to it."""
    found = resolve(switch.after)
    try:
        parameters = inspect.signature(found).parameters if found is not None else {}
    except (TypeError, ValueError):
        return {}
    return {
        name: parameters[name].default
        for name in switch.carried
        if name in parameters and parameters[name].default is not inspect.Parameter.empty
    }


#: the sections of a run's config that a checkpoint carries: what it takes to rebuild model and data
CARRIED = ("seed_everything", "model", "data")
#: data settings that belong to one invocation, not to the run that made the checkpoint
PER_INVOCATION = ("predict_path", "preprocessing_from", "resplit_on_resume")
#: options whose values are paths, never class names
PATH_OPTIONS = ("--output", "--ckpt_path", "--data.path", "--data.predict_path", "--data.preprocessing_from")

#: what a resumed fit restores from the checkpoint instead of building it from the settings
RESTORED = ("optimizer", "scheduler", "scheduler_interval")


def check_resumable(saved: Any, now: Any, ckpt_path: str) -> None:
    """Refuse a resumed fit whose seed, optimizer or scheduler settings (``now``, the run's config) differ
    from those the checkpoint was trained with (``saved``, the config it carries): the run goes on from
    the checkpoint's state, and a changed setting would be recorded but not used."""
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


def differences(old: Any, new: Any, where: str) -> list[tuple[str, Any, Any]]:
    """``(key, old value, new value)`` for each setting that differs between two nested configs; a
    changed class is one difference (its own arguments are then a new class's)."""
    if isinstance(old, dict) and isinstance(new, dict):
        if old.get("class_path") != new.get("class_path"):
            return [(f"{where}.class_path", old.get("class_path"), new.get("class_path"))]
        keys = [key for key in new if key in old and key != "class_path"]
        return [found for key in keys for found in differences(old[key], new[key], f"{where}.{key}")]
    return [] if old == new else [(where, old, new)]


def own_default_words(layers: list[dict[str, Any]], words: list[str]) -> tuple[list[str], list[str]]:
    """For each class a later layer (or a word) put in place of an unrelated one, its own defaults for
    the arguments the earlier class was given and the later layer does not give again (SGD's
    ``weight_decay`` after AdamW's), as one ``--config`` layer to parse after every other word, so that
    ``--print_config``, the saved config and the run agree; and one line per switch saying so."""
    layer: dict[str, Any] = {}
    said: list[str] = []
    for key, switch in switched_classes(layers, words).items():
        defaults = {
            name: value
            for name, value in defaults_of(switch).items()
            if plain(value) != plain(switch.carried[name])
        }
        if not defaults:
            continue
        node = layer
        for part in key:
            node = node.setdefault(part, {})
        node.update({"class_path": switch.after, "init_args": {k: plain(v) for k, v in defaults.items()}})
        before = ", ".join(f"{name}={switch.carried[name]!r}" for name in defaults)
        after = ", ".join(f"{name}={value!r}" for name, value in defaults.items())
        said.append(
            f"{'.'.join(key)}: {switch.after} replaces {switch.before} and starts from its own defaults "
            f"({after}), not from what was given for {switch.before.rpartition('.')[2]} ({before}); give "
            "them again to keep them."
        )
    return (["--config", yaml.safe_dump(layer)] if layer else []), said


def plain(value: Any) -> Any:
    """A value as YAML writes it (tuples are lists)."""
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
    from src.data import TabularDataModule  # the data a config names none of

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


def check_options(config: Any, subcommand: str) -> None:
    """Refuse, in one sentence, options that do not belong to the subcommand or cannot do what they say;
    ``config`` is the subcommand's parsed config (``--output`` checked against the run's inputs)."""
    if config.get("weights_only") is False:
        raise UserInputError(
            "--weights_only=false would let a checkpoint run code as it loads; checkpoints are read as "
            "tensors and plain data only here, so leave it out."
        )
    # Lightning's own restore reads the checkpoint too, through whatever checkpoint plugin is in use
    config["weights_only"] = True
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
class Parsed:
    """What :func:`parse_words` made of the words."""

    config: Any
    subcommand: str | None
    #: the checkpoint file given as ``--ckpt_path`` (typed or from a config file), else ``None``
    ckpt_path: str | None = None
    #: the settings the checkpoint a ``fit`` resumes from carries
    resumed: Any = None


def parse_words(parser: Any, words: list[str]) -> Parsed:
    """Parse ``words``; with a checkpoint file as ``--ckpt_path``, over the settings the checkpoint carries
    (:func:`carried_settings`, one layer above the defaults): what the user typed wins, the checkpoint fills
    in what they did not say, the defaults the rest. A class a later layer switched to an unrelated one
    starts from its own defaults (:func:`own_default_words`), which one line per switch says."""
    check_config_files(words)
    subcommand = next((word for word in words if word in SUBCOMMANDS), None)
    layer: dict[str, Any] | None = None

    def parse(given: list[str]) -> Any:
        layers = layers_of(words, config_files(words), layer)
        return parser.parse_args([*given, *own_default_words(layers, words)[0]])

    typed = option_value(words, "--ckpt_path")
    ckpt_path, config = typed, None
    if ckpt_path is None:  # none typed: one may still come from a config file
        config = parse(words)
        found = config.get(f"{subcommand}.ckpt_path") if subcommand else None
        ckpt_path = str(found) if found is not None else None
    parsed = Parsed(config, subcommand)
    if subcommand is not None and ckpt_path is not None and is_checkpoint_file(ckpt_path):
        # one sentence for a URL, a missing, broken or unsafe file; and nothing the checkpoint names is
        # imported while it is parsed unless it is trusted or the user named it
        checkpoint = load_checkpoint(ckpt_path)
        check_names(checkpoint, ckpt_path, user_named(words))
        parsed.resumed = checkpoint.get("config") if subcommand == "fit" else None
        layer = carried_settings(checkpoint.get("config"), ckpt_path)
        at = words.index(subcommand) + 1
        parsed.config = parse([*words[:at], "--config", yaml.safe_dump(layer), *words[at:]])
        parsed.ckpt_path = ckpt_path
    elif parsed.config is None:
        parsed.config = parse(words)
    if subcommand is not None and typed is not None and parsed.config.get(f"{subcommand}.ckpt_path") is None:
        # a config file's `ckpt_path: null` (every saved run config has one) does not undo a typed path
        parsed.config[subcommand]["ckpt_path"] = typed
    for line in own_default_words(layers_of(words, config_files(words), layer), words)[1]:
        notice(line)
    return parsed


def shipped_callbacks(config: Any, subcommand: str | None) -> list[Any]:
    """The callbacks of the sections that are on, as built. A subcommand other than predict leaves out the
    prediction writer (the Trainer calls every callback at each hook of every step, whether it acts or not);
    ``trainer.enable_checkpointing=false`` leaves out the sections that are ModelCheckpoints,
    ``enable_progress_bar=false`` the progress bar and ``enable_model_summary=false`` the model summary, so
    that each means what it says instead of clashing with them (one given in ``trainer.callbacks`` still
    clashes: the user asked for both)."""
    trainer = config.get("trainer") or {}
    off: list[type] = [] if subcommand in (None, "predict") else [BasePredictionWriter]
    off += [ModelCheckpoint] if trainer.get("enable_checkpointing") is False else []
    off += [ProgressBar] if trainer.get("enable_progress_bar") is False else []
    off += [ModelSummary] if trainer.get("enable_model_summary") is False else []
    on = [config[section] for section in callback_sections() if config.get(section) is not None]
    return [callback for callback in on if not isinstance(callback, tuple(off))]
