"""Bad input on the command line becomes one sentence on stderr and exit status 2, never a traceback."""

import ast
import logging
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import yaml
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser
from torch.nn.parameter import UninitializedParameter
from typing_extensions import override

from src.errors import UserInputError, process_group_error
from src.files import free_space, out_of_room, refusal_to_create

NOISE = (
    "Does not validate against any of the",
    "Subtypes:",
    "Errors:",
    "Given value",
    "Got value",
    "Parser key",
    "Problem with given class_path",
    "Expected a <class 'NoneType'>",
)


#: LightningCLI's own optimizer and scheduler options, switched off, and the model's argument instead
MOVED = {
    "--optimizer": ("the optimizer", "model.init_args.optimizer"),
    "--lr_scheduler": ("the scheduler", "model.init_args.scheduler"),
}


def moved_option(message: str) -> str | None:
    """The sentence for an unrecognized ``--optimizer`` or ``--lr_scheduler`` (any form); else ``None``."""
    found = re.match(r"unrecognized arguments: (.+)", message.strip(), re.IGNORECASE)
    words = found.group(1).split() if found else []
    for i, word in enumerate(words):
        option = next((o for o in MOVED if re.match(rf"{o}(?=$|[=.])", word)), None)
        if option is None:
            continue
        typed = " ".join(words[i : i + 2]) if word == option and i + 1 < len(words) else word
        what, where = MOVED[option]
        return (
            f"{typed} is not an option: {what} is the model's own argument, {where}; write "
            f"{typed.replace(option, f'--{where}', 1)}"
        )
    return None


def stray_keys(given: str) -> list[str]:
    """The keys of a class's mapping as jsonargparse quotes it (``{'init_args': ..., 'callbacks': ...}``)
    that a class's mapping does not take."""
    try:
        value = ast.literal_eval(given.strip().strip('"'))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return []
    known = ("class_path", "init_args", "dict_kwargs")
    return [str(key) for key in value if key not in known] if isinstance(value, dict) else []


def summarize(message: str) -> str:
    """jsonargparse's report of a rejected value, as one line: the key, the value and why."""
    moved = moved_option(message)
    if moved is not None:
        return moved
    keys = re.findall(r'Parser key "([^"]+)"', message)
    unknown = re.search(r"class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", message)
    if keys and unknown:  # a key the chosen class does not take (a misspelling, an old name)
        chosen, option = unknown.groups()
        if chosen.rpartition(".")[2] == "Callback":  # a callback section switched off has no class
            return (
                f"{keys[0]} is off (null), so it has no class to take {option}; name its class again "
                f"(--{keys[0]}=<class>) or leave out the null; --{keys[0]}.help <class> lists its options"
            )
        return f"{keys[0]}.{option} is not an option of {chosen}; --{keys[0]}.help {chosen} lists its options"
    given = re.search(r"(?:Given value|Got value): (.+)", message)
    if not keys:
        return " ".join(line.strip() for line in message.splitlines() if line.strip())
    reasons = [line.strip().lstrip("- ").strip() for line in message.splitlines()]
    reasons = [r for r in reasons if r and not r.startswith(NOISE)]
    choices = re.findall(r"Expected a typing\.Literal\[(.+?)\]\n", message)
    if choices:
        why = "expected one of " + ", ".join(choices)
    else:
        # what is wrong with a class first, then a key or a value
        telling = [
            r for pattern in ("abstract", "has no attribute", "not expected", "not accessible")
            for r in reasons if pattern in r
        ]  # fmt: skip
        why = (telling or reasons or ["not accepted"])[0].split(". Got value")[0]
        why = re.sub(r"Expected a <class '(\w+)'>", r"expected \1", why)
    where = ".".join(dict.fromkeys(k for k in keys if k))  # outer key, then the nested one, once each
    stray = stray_keys(given.group(1) if given else "")
    if stray and "subclass" in why:  # a key at a class's level that belongs elsewhere (its indentation)
        return (
            f"{where}.{stray[0]} is not a key of {where}, which takes class_path, init_args and dict_kwargs; "
            "move it where it belongs (check its indentation)"
        )
    # a value jsonargparse assembled itself (a nested key, a class with all its arguments) says nothing
    value = (
        f" {given.group(1).strip()!r}"
        if given and not given.group(1).startswith(("NestedArg", "Namespace("))
        else ""
    )
    return f"{where}:{value} is not accepted ({why.rstrip('.')})"


class Parser(LightningArgumentParser):
    """LightningCLI's parser, whose errors are one line instead of the usage text and every type tried."""

    @override
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse parsing a nested value: it catches this and goes on
            super().error(message, ex)
        summary = summarize(message)
        tail = "" if "lists its options" in summary else "; --help lists the options"
        sys.stderr.write(f"error: {summary}{tail}.\n")
        raise SystemExit(2)


class ConfigProblem(yaml.YAMLError):
    """Why a config file that YAML reads without complaint is wrong anyway; the words after its name."""


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, also refusing duplicate keys, alias bombs and empty :attr:`NOT_NULL` sections."""

    #: values that aliases may add to a config (a shared optimizer setting adds a handful)
    MAX_EXPANDED = 10_000
    #: sections whose null would drop every setting given before (others are null on purpose)
    NOT_NULL = ("trainer", "model", "data")

    @override
    def compose_document(self) -> yaml.Node:
        document = super().compose_document()
        self.check_expansion(document)
        if isinstance(document, yaml.MappingNode):
            for key, value in document.value:
                if key.value in self.NOT_NULL and value.tag == "tag:yaml.org,2002:null":
                    raise ConfigProblem(
                        f"has an empty {key.value} section at line {key.start_mark.line + 1}, which would "
                        f"drop every {key.value} setting given before it; remove the `{key.value}:` line or "
                        "give it settings."
                    )
        return document

    def check_expansion(self, document: yaml.Node) -> None:
        """Count the values aliases repeat, each anchored value sized once: linear in the file's length."""
        sizes: dict[int, int] = {}  # id(node) → values in it, aliases expanded
        counting: set[int] = set()  # nodes whose size is being counted: an alias to one is a loop
        added = 0

        def size(node: yaml.Node, parent: yaml.Node) -> int:
            nonlocal added
            if id(node) in sizes:  # a second arrival: an alias
                added += sizes[id(node)]
                if added > self.MAX_EXPANDED:
                    raise ConfigProblem(
                        f"expands its aliases beyond {self.MAX_EXPANDED:,} values at line "
                        f"{parent.start_mark.line + 1}, far more than a config holds; write the settings out "
                        "instead of nesting aliases."
                    )
                return sizes[id(node)]
            if id(node) in counting:
                raise ConfigProblem(
                    f"has an alias inside the value it names at line {parent.start_mark.line + 1}, which "
                    "never ends; write the settings out."
                )
            counting.add(id(node))
            children = node.value if isinstance(node, yaml.SequenceNode) else []
            if isinstance(node, yaml.MappingNode):
                children = [child for pair in node.value for child in pair]
            sizes[id(node)] = 1 + sum(size(child, node) for child in children)
            counting.discard(id(node))
            return sizes[id(node)]

        size(document, document)

    @override
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], int] = {}  # (tag, key) → its line
        for key, _ in node.value:
            # `<<: *base` merges another mapping; a key given after it overrides, as meant
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            line = key.start_mark.line + 1
            if (key.tag, key.value) in seen:
                raise ConfigProblem(
                    f"gives {key.value} a second time at line {line} (first at line "
                    f"{seen[key.tag, key.value]}), and YAML would keep only the last; merge them into one."
                )
            seen[key.tag, key.value] = line
        return super().construct_mapping(node, deep)


def check_config_files(words: list[str]) -> None:
    """Refuse, before parsing, a ``--config FILE`` that is not a UTF-8 YAML file of settings."""
    for i, word in enumerate(words):
        value = words[i + 1] if word in ("--config", "-c") and i + 1 < len(words) else None
        if word.startswith("--config="):
            value = word.split("=", 1)[1]
        if not value or "\n" in value:
            continue  # a YAML string given inline (the checkpoint's own settings)
        path = Path(value)
        if path.is_dir():
            raise UserInputError(
                f"config file {value!r} is a folder, not a file; give the path of a YAML file."
            )
        if not path.is_file():
            if value.endswith((".yaml", ".yml")):
                raise UserInputError(f"config file {value!r} does not exist.")
            continue  # not a file name: YAML given inline
        check_config_file(path, value)


def check_config_file(path: Path, value: str) -> None:
    """One config file, named ``value`` as the user gave it."""
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except OSError as err:
        raise UserInputError(f"config file {value!r} cannot be read ({err.strerror}).") from err
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - raw.rfind(b"\n", 0, err.start)
        raise UserInputError(
            f"config file {value!r} is not UTF-8 text (byte 0x{raw[err.start]:02x} at line {line}, column "
            f"{column}); save it as UTF-8."
        ) from err
    try:
        loaded = yaml.load(text, Loader=ConfigLoader)  # a SafeLoader: builds no objects
    except ConfigProblem as err:
        raise UserInputError(f"config file {value!r} {err}") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserInputError(f"config file {value!r} is not valid YAML{where} ({problem}); fix it.") from err
    if loaded is None:
        what = "is empty" if not text.strip() else "holds no settings"
        raise UserInputError(f"config file {value!r} {what}; give it settings or leave it out.")
    if not isinstance(loaded, dict):
        what = "a list" if isinstance(loaded, list) else f"the single value {loaded!r}"
        raise UserInputError(
            f"config file {value!r} holds {what}, not settings; write `key: value` lines, as "
            "configs/defaults.yaml does."
        )


def check_log_folder(save_dir: Any) -> None:
    """The logger's ``save_dir`` must be a folder this process can write, or be creatable as one."""
    if not isinstance(save_dir, str | Path):
        return
    path = Path(save_dir)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise UserInputError(
            f"trainer.logger.init_args.save_dir={str(save_dir)!r} cannot be a folder: {str(existing)!r} is a "
            "file; choose another save_dir."
        )
    if refusal_to_create(existing) is not None:
        raise UserInputError(
            f"trainer.logger.init_args.save_dir={str(save_dir)!r} is not writable ({str(existing)!r} "
            "refuses new files); choose another save_dir."
        )


def does_not_fit(detail: str) -> str:
    """The sentence for a checkpoint whose weights do not fit the model (``detail``: torch's first)."""
    return (
        f"the checkpoint does not fit the configured model ({detail}), which is built from the config and "
        "the data's shapes (its columns, classes or characters); give the config and data the checkpoint "
        "was trained with, leave --config out to use the one it carries, or start a new run."
    )


def check_fits(weights: dict[str, Any], model: torch.nn.Module) -> None:
    """Refuse checkpoint ``weights`` shaped otherwise than ``model``'s tensors of the same name."""
    for name, tensor in model.state_dict().items():
        saved = weights.get(name)
        if isinstance(tensor, UninitializedParameter) or not isinstance(saved, torch.Tensor):
            continue
        if saved.shape != tensor.shape:
            raise UserInputError(
                does_not_fit(
                    f"size mismatch for {name}: copying a param with shape {saved.shape} from checkpoint, "
                    f"the shape in current model is {tensor.shape}"
                )
            )


def user_error(err: BaseException) -> str | None:
    """The one sentence for an error that bad input caused, or ``None`` for a bug (keep the traceback)."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, UserInputError | MisconfigurationException):
            return str(cause).strip().splitlines()[0]
        if isinstance(cause, RuntimeError) and "Error(s) in loading state_dict" in str(cause):
            first = str(cause).splitlines()[1].strip() if len(str(cause).splitlines()) > 1 else ""
            return does_not_fit(first.rstrip("."))
        cause = cause.__cause__ or cause.__context__
    room = out_of_room(err)
    if room is not None:  # a writer that is not the project's own (TensorBoard's event files, say)
        if room.filename is None:
            return "a file of the run could not be written: no space left on its disk; free some space."
        return (
            f"cannot write {room.filename!r}: no space left on its disk ({free_space(room.filename)} free); "
            "free some space or write elsewhere."
        )
    return None


def lost_process(err: BaseException) -> str | None:
    """The sentence for a distributed run whose processes never met or lost one another, else ``None``."""
    cause = process_group_error(err)
    if cause is None:
        return None
    # the first line, less its source location and advice (a C++ stack follows)
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    reason = re.sub(r"^\[[^\]]*\]\s*", "", first).split(". ")[0].rstrip(".")
    who = f"rank {dist.get_rank()} of {dist.get_world_size()}" if dist.is_initialized() else "this process"
    notes = "; ".join(getattr(cause, "__notes__", []))
    if isinstance(cause, dist.DistNetworkError) and not dist.is_initialized():
        where = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '?')}"
        return (
            f"{who} could not meet the other processes of the distributed run at {where} ({reason}); "
            "free that port or choose another (MASTER_PORT, or torchrun's --master_port) and start again."
        )
    saved = notes or "the checkpoints written before are whole: resume from the last with --ckpt_path"
    return f"{who} lost the other processes of the distributed run ({reason}) and stopped; {saved}."


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
    # none is news: the model_summary section is meant, and the CLI said which checkpoint it tests
    said = (
        "Trainer already configured with model summary",
        "Loading `train_dataloader` to estimate number",
        "Restoring states from the checkpoint path at",
        "Loaded model weights from the checkpoint at",
    )
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: not record.getMessage().startswith(said)
    )
    # a fit writes into a folder holding checkpoints only when allowed (SaveConfig.refusal)
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    # an epoch shorter than log_every_n_steps still logs: StepValues counts optimizer steps across epochs
    warnings.filterwarnings(
        "ignore", message=r"The number of training batches \(\d+\) is smaller than the logging interval"
    )


def as_command(main: Callable[[], object]) -> None:
    """``main`` on the shell's words; a thread's error that has a sentence (TensorBoard's writer on a full
    disk) ends the run as one sentence, unless the fit's own does."""
    kept: list[str] = []
    report = threading.excepthook

    def keep(args: threading.ExceptHookArgs) -> None:
        sentence = None if args.exc_value is None else user_error(args.exc_value)
        if sentence is None:
            report(args)
        else:
            kept.append(sentence)

    threading.excepthook = keep  # never restored: the dying thread may report after the fit has ended
    main()
    if kept:
        print(f"error: {kept[0]}", file=sys.stderr)
        raise SystemExit(2)
