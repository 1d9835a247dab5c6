"""Reading checkpoints as data: one loader (:func:`load_checkpoint`, ``weights_only=True``) and one trust
rule (:func:`check_names`) for every checkpoint the project opens; :func:`load_model` rebuilds its model."""

import importlib
import importlib.util
import re
import sys
import sysconfig
from collections.abc import Container, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch
import yaml

from src.errors import UserInputError

if TYPE_CHECKING:  # Lightning is imported when a model is loaded, not when a checkpoint is read
    from lightning import LightningModule

#: keys whose text value is a class or function to import, importable or not
CLASS_KEYS = ("class_path",)
#: what a checkpoint may name by itself: classes of this project, and the library classes configs use
TRUSTED_PREFIXES = (
    "src.",
    "torch.optim.",
    "torch.nn.",
    "torchmetrics.",
    "lightning.pytorch.loggers.",
    "lightning.pytorch.callbacks.",
)
#: functions (not classes) a checkpoint may name: the one Lightning's saving records
TRUSTED_FUNCTIONS = ("lightning.pytorch.cli.instantiate_module",)
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
#: the project's folder: a module whose file lies in it (not in a ``.venv`` there) is the user's own code
PROJECT = Path(__file__).resolve().parent.parent
#: the sections of a checkpoint that are read as settings (the rest is state: tensors and numbers)
SETTINGS = ("hyper_parameters", "datamodule_hyper_parameters", "config")


def model_class_name(checkpoint: dict[str, Any]) -> str | None:
    """The ``model.class_path`` of the config the checkpoint carries, or ``None``."""
    config = checkpoint.get("config")
    model = config.get("model") if isinstance(config, dict) else None
    class_path = model.get("class_path") if isinstance(model, dict) else None
    return class_path if isinstance(class_path, str) else None


def load_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """The Lightning checkpoint at ``path``: :func:`read_data` of it, which must hold a ``state_dict``."""
    checkpoint = read_data(path, map_location)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise UserInputError(
            f"checkpoint {str(path)!r} is not a Lightning checkpoint (it has no state_dict)."
        )
    return checkpoint


def read_data(path: str | Path, map_location: Any = "cpu") -> Any:
    """What ``torch.save`` wrote at ``path``, as tensors and plain data only, or one sentence why not."""
    text = str(path)
    where = f"checkpoint {text!r}"
    if "://" in text:
        raise UserInputError(f"{where} is a URL; download it and pass the local file (read as data only).")
    file = Path(path)
    if file.is_dir():
        raise UserInputError(f"{where} is a folder; pass the path of a .ckpt file inside it.")
    if not file.is_file():
        raise UserInputError(f"{where} does not exist; pass the path of a .ckpt file.")
    try:
        return torch.load(file, map_location=map_location, weights_only=True)
    except Exception as err:  # torch.load fails in many ways on a file that is not a checkpoint
        raise UserInputError(f"{where} {_why_unreadable(file, err)}") from err


def _why_unreadable(file: Path, err: Exception) -> str:
    """The end of the sentence for a file ``torch.load(weights_only=True)`` refused."""
    if "unsupported global" in str(err).lower():  # a class or function was asked for
        return (
            "holds objects other than tensors and plain data, which would run code when loaded; it was "
            "refused unread."
        )
    with file.open("rb") as handle:
        head = handle.read(2)
    if not head:
        return "is empty (0 bytes); pass a checkpoint that was saved whole."
    if head == b"PK":  # a zip archive's signature: torch.save's format, cut short or damaged
        return "is damaged or truncated (its archive cannot be read); pass a whole checkpoint."
    if head[:1] == b"\x80":  # a pickle's first opcode: PROTO, then the protocol number
        return (
            "is a pickle, not a checkpoint saved by torch.save; a pickle can run code when loaded, so it "
            "was refused unread."
        )
    return "is not a checkpoint file (neither torch.save's archive nor its older format)."


def names_of_code(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """Every ``(key path, dotted name)`` in ``value``, at any depth, that parsing it could import."""
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{where}.{key}" if where else str(key)
            if key in CLASS_KEYS and isinstance(item, str):
                if "." in item:  # a bare name is looked up among classes already imported
                    yield inner, item
            else:
                yield from names_of_code(item, inner)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from names_of_code(item, f"{where}[{i}]")
    elif isinstance(value, str) and DOTTED.fullmatch(value) and _file_text(value) is None:
        if _found(value.split(".", 1)[0]):
            yield where, value
    elif isinstance(value, str):
        # as jsonargparse reads it: YAML, or the path of a YAML file
        try:
            parsed = yaml.safe_load(_file_text(value) or value)
        except yaml.YAMLError:
            return
        if isinstance(parsed, dict | list) or (isinstance(parsed, str) and parsed != value):
            yield from names_of_code(parsed, where)


def _file_text(value: str) -> str | None:
    """The text of the file ``value`` names, if it names one of at most a mebibyte (a config)."""
    try:
        path = Path(value)
        return path.read_text(errors="replace") if path.is_file() and path.stat().st_size <= 2**20 else None
    except (OSError, ValueError):  # not a path this system can have
        return None


def _found(module: str) -> bool:
    """Whether Python could import ``module`` (nothing is run but its parents' imports)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def resolve(name: str) -> Any:
    """The object a dotted name of a trusted module names, or ``None`` when there is none."""
    module, _, attribute = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attribute, None)
    except (ImportError, ValueError):  # no such module, or no module named at all
        return None


def in_project(name: str) -> bool:
    """Whether a dotted name's top-level module lies in :data:`PROJECT`, found without importing it."""
    try:
        spec = importlib.util.find_spec(name.split(".", 1)[0])
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    locations = [spec.origin] if spec.origin else list(spec.submodule_search_locations or [])
    installed = {sysconfig.get_path(key) for key in ("purelib", "platlib", "stdlib")} | {sys.prefix}
    outside = [Path(folder).resolve() for folder in installed if folder]
    return bool(locations) and all(
        Path(location).resolve().is_relative_to(PROJECT)
        and not any(Path(location).resolve().is_relative_to(folder) for folder in outside)
        for location in locations
        if location
    )


def _imported_module_class(name: str) -> bool:
    """Whether ``name`` is an ``nn.Module`` class already imported: naming it imports nothing."""
    module, _, attribute = name.rpartition(".")
    # vars(), not getattr: a lazy attribute (src.data's DataModules) is not imported by asking
    found = vars(sys.modules[module]).get(attribute) if module in sys.modules else None
    return isinstance(found, type) and issubclass(found, torch.nn.Module)


#: prefixes of dotted names that moved, and the plug-in that holds them now
MOVED = {
    "src.data.TabularDataModule": "tables",
    "src.data.datamodule.": "tables",
    "src.data.options.": "tables",
    "src.data.preprocessing.": "tables",
    "src.data.sources.": "tables",
}


def moved_to(name: str) -> str | None:
    """The plug-in a dotted name that moved lives in now (:data:`MOVED`); ``None`` for one that did not."""
    return next((kind for old, kind in MOVED.items() if name.startswith(old)), None)


def check_names(
    checkpoint: dict[str, Any], path: str | Path, allowed: Container[str] = (), import_trusted: bool = True
) -> None:
    """Refuse ``checkpoint`` if it names code that is not ``allowed`` (named by the user), this project's,
    :data:`TRUSTED_FUNCTIONS` or a class under :data:`TRUSTED_PREFIXES` (imported, if ``import_trusted``)."""
    for key, name in (
        found for section in SETTINGS for found in names_of_code(checkpoint.get(section), section)
    ):
        if name in allowed or name in TRUSTED_FUNCTIONS or _imported_module_class(name):
            continue
        yours = in_project(name)
        if not (yours or name.startswith(TRUSTED_PREFIXES)):
            raise UserInputError(
                f"checkpoint {str(path)!r} names {name!r} (at {key}), code outside this project that is "
                "not imported on a checkpoint's word; name that class yourself (--model or a --config file, "
                "or import it before loading, in Python) if you trust it."
            )
        found = resolve(name) if import_trusted else None
        if import_trusted and not (isinstance(found, type) or (yours and callable(found))):
            if found is None and (new := moved_to(name)) is not None:
                raise UserInputError(
                    f"checkpoint {str(path)!r} names {name!r} (at {key}), which moved to the {new} plug-in "
                    f"(its README names the new path); its settings name the old place, so train a new run."
                )
            gone = found is None and name.startswith("src.") and not _found(name.rpartition(".")[0])
            why = (
                "which this project does not have: put back the extra or module it was written with, if it "
                "was removed since"
                if gone
                else "which is not a class of this project or its libraries; it was made by other code, or "
                "is damaged"
            )
            raise UserInputError(f"checkpoint {str(path)!r} names {name!r} (at {key}), {why}.")


def load_model(
    path: str | Path, model_class: "type[LightningModule] | None" = None
) -> "tuple[LightningModule, dict[str, Any]]":
    """The checkpoint's model (``model_class``, else the one it names) on the CPU in eval mode, and itself."""
    from lightning import LightningModule

    checkpoint = load_checkpoint(path)
    named = {f"{model_class.__module__}.{model_class.__qualname__}"} if model_class else set()
    check_names(checkpoint, path, named)
    class_path = model_class_name(checkpoint)
    found = model_class or (resolve(class_path) if class_path is not None else None)
    if not (isinstance(found, type) and issubclass(found, LightningModule)):
        what = f"names {class_path!r}, which is not a LightningModule" if found else "names no model class"
        raise UserInputError(f"checkpoint {str(path)!r} {what}; pass the class it was trained with.")
    options: dict[str, Any] = {}  # compiling pays off in training, not in a forward pass per request
    if "compile_net" in (checkpoint.get("hyper_parameters") or {}):
        options["compile_net"] = False
    try:
        model = found.load_from_checkpoint(path, map_location="cpu", **options)
    except UserInputError:
        raise
    except (TypeError, RuntimeError, ValueError) as err:  # other arguments or weights than the class's
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserInputError(
            f"checkpoint {str(path)!r} does not fit {found.__name__} ({first.rstrip('.')}); pass the class "
            "it was trained with."
        ) from err
    return model.eval(), checkpoint


def check_for_class(checkpoint_path: "str | Path | IO[bytes]", cls: type) -> None:
    """Read the checkpoint as data and check its names, ``cls`` and its subclasses counting as named."""
    if isinstance(checkpoint_path, str | Path):
        checkpoint = load_checkpoint(checkpoint_path)
    else:  # a file object: read, then rewound for Lightning
        start = checkpoint_path.tell()
        checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
        checkpoint_path.seek(start)
    family = [cls, *_subclasses(cls)]
    check_names(checkpoint, str(checkpoint_path), {f"{c.__module__}.{c.__qualname__}" for c in family})


def _subclasses(cls: type) -> list[type]:
    """Every subclass of ``cls`` imported so far, at any depth."""
    found: list[type] = []
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        found += [sub, *_subclasses(sub)]
    return found
