"""Reading checkpoints as data: one loader for every checkpoint the project opens itself."""

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from src.errors import UserInputError


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint at ``path``, read with ``torch.load(weights_only=True)`` onto the CPU.

    Only tensors and plain data come back: a file that would need to run code to load is refused, as is
    a URL (download it, then pass the local file), a missing file, or one that is not a checkpoint.
    """
    text = str(path)
    if "://" in text:
        raise UserInputError(
            f"checkpoint {text!r} is a URL; download it and pass the local file (it is then read as data "
            "only)."
        )
    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"checkpoint {text!r} does not exist; pass the path of a .ckpt file.")
    try:
        checkpoint = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "Unsupported global" not in str(err):  # no class was asked for: text, an image, noise
            raise UserInputError(
                f"checkpoint {text!r} is not a checkpoint file (it could not be read)."
            ) from err
        raise UserInputError(
            f"checkpoint {text!r} holds objects other than tensors and plain data, which would run code "
            "when loaded; it was refused."
        ) from err
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as err:
        raise UserInputError(
            f"checkpoint {text!r} could not be read (truncated, or not a checkpoint: "
            f"{str(err).splitlines()[0].split('. ')[0]})."
        ) from err
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise UserInputError(f"checkpoint {text!r} is not a Lightning checkpoint (it has no state_dict).")
    return checkpoint
