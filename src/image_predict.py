"""Predictions on image files from a checkpoint alone: the path that export and serving share for images.

```python
from src.image_predict import ImagePredictor

predictor = ImagePredictor.from_checkpoint("logs/images/version_0/checkpoints/last.ckpt")
predictor.predict(["cat.png", open("dog.jpg", "rb").read()])  # a DataFrame: prediction, probabilities
```

An image (a file, its bytes, or a Pillow image) is read by the one rule of :mod:`src.data.images` in the
checkpoint's mode and, if the run resized its images (``data.image_size``), resized to its size, as
:class:`src.data.images.ImageDataModule` reads files to train on and to predict. The pixels, uint8
``(H, W, C)``, go through :class:`ImageGraph`: floats on the 0…1 scale, standardized with the statistics
fitted in the run, then the net. The exported graph is that module.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pandas as pd
import torch
from PIL import Image
from torch import nn

from src.checkpoints import check_names, load_checkpoint, resolve
from src.data.images import CHANNELS, FITTED, Mode, array_of, read_image, sized
from src.errors import UserInputError
from src.models import BaseTask
from src.predict import prediction_frame
from src.speedups import class_saved_by_the_cli

#: what a caller may hand :meth:`ImagePredictor.predict`: a file, the bytes of one, or a decoded image
ImageInput = Image.Image | str | Path | bytes


def image_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The fitted state an image run saved (where Lightning puts the DataModule's ``state_dict``), or None
    for a checkpoint of another kind of data."""
    for value in checkpoint.values():
        if isinstance(value, dict) and all(key in value for key in FITTED):
            return value
    return None


def carries_images(ckpt_path: str | Path) -> bool:
    """Whether the checkpoint at ``ckpt_path`` was written by an image run (one sentence if unreadable)."""
    return image_state(load_checkpoint(ckpt_path)) is not None


@dataclass(frozen=True)
class ImagePreprocessing:
    """What an image run fitted and how it read its files: enough to read new images as it did.

    Args:
        labels: Class names in class-id order.
        mode: ``L`` or ``RGB``.
        size: (H, W) of the images the net saw.
        resize: Whether images of another size are resized (the run set ``data.image_size``) or refused.
        mean: ``(C,)`` per-channel mean on the 0…1 scale, of the training split.
        std: ``(C,)`` per-channel standard deviation on the 0…1 scale, of the training split.
    """

    labels: list[str]
    mode: Mode
    size: tuple[int, int]
    resize: bool
    mean: torch.Tensor
    std: torch.Tensor

    @classmethod
    def of(cls, checkpoint: dict[str, Any], path: str) -> "ImagePreprocessing":
        """The checkpoint's fitted state, and whether its run resized images (its data settings)."""
        state = image_state(checkpoint)
        if state is None:
            raise UserInputError(
                f"checkpoint {path!r} carries no fitted image statistics (it was not written by a run of "
                "ImageDataModule); train a new one."
            )
        data = checkpoint.get("datamodule_hyper_parameters") or {}
        height, width = (int(n) for n in state["size"])
        return cls(
            labels=[str(label) for label in state["label_names"]],
            mode=cast(Mode, state["mode"]),
            size=(height, width),
            resize=data.get("image_size") is not None,
            mean=state["mean"].float().clone(),
            std=state["std"].float().clone(),
        )

    @property
    def channels(self) -> int:
        return CHANNELS[self.mode]

    def pixels(self, image: Image.Image, where: str) -> torch.Tensor:
        """A decoded image → uint8 ``(H, W, C)`` in this mode and size, as the DataModule reads a file."""
        return self.read(image, where)

    def read(self, item: ImageInput, where: str) -> torch.Tensor:
        """One image, given as a file, its bytes or a Pillow image → uint8 ``(H, W, C)`` by the one rule
        (:func:`src.data.images.read_image`); a file that is no image, or of another size when the run did
        not resize, is one sentence naming ``where``."""
        source = Path(item) if isinstance(item, str) else item
        fix = "send a PNG or JPEG file" if isinstance(item, bytes) else "replace or remove it"
        image = read_image(source, self.mode, where, fix)
        fitting = sized(image, self.size, self.resize)
        if fitting is None:
            height, width = self.size
            raise UserInputError(
                f"{where} is {image.width}x{image.height} but the model was trained on "
                f"{width}x{height} images without resizing; send images of that size."
            )
        return torch.from_numpy(array_of(fitting).copy())

    def state(self) -> dict[str, Any]:
        """As plain data, for the export's sidecar."""
        return {
            "labels": list(self.labels),
            "mode": self.mode,
            "channels": self.channels,
            "size": list(self.size),
            "resize": self.resize,
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
        }


class ImageGraph(nn.Module):
    """Raw pixels → logits: what an exported image graph holds.

    ``images`` uint8 ``(B, H, W, C)``, as decoded files stack, → floats on the 0…1 scale → standardized
    per channel with the training statistics → the task's ``forward``: logits ``(B, K)``.
    """

    mean: torch.Tensor  # (1, C, 1, 1) buffers: saved with the graph, moved with it
    std: torch.Tensor

    def __init__(self, model: BaseTask, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", mean.view(1, -1, 1, 1))  # (1, C, 1, 1)
        self.register_buffer("std", std.view(1, -1, 1, 1))

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 ``(B, H, W, C)`` → standardized float ``(B, C, H, W)``, the DataModule's operations in its
        order (``/ 255``, then ``(x - mean) / std``), so the values are the same to the bit."""
        x = images.permute(0, 3, 1, 2).float() / 255
        return (x - self.mean) / self.std

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(self.normalize(images))  # (B, K) raw logits


class ImagePredictor:
    """A trained image classifier with what its run fitted: images in, labelled predictions out.

    Args:
        model: The trained task.
        preprocessing: What the same run fitted, and how it read its images.
        batch_size: Images per forward pass.
    """

    def __init__(self, model: BaseTask, preprocessing: ImagePreprocessing, batch_size: int = 256) -> None:
        self.model = model.eval()
        self.preprocessing = preprocessing
        self.graph = ImageGraph(self.model, preprocessing.mean, preprocessing.std).eval()
        self.batch_size = batch_size

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, model_class: type[BaseTask] | None = None, batch_size: int = 256
    ) -> "ImagePredictor":
        """Load a checkpoint as data (``weights_only=True``) and rebuild its model on the CPU, as
        :meth:`src.predict.Predictor.from_checkpoint` does: a checkpoint never chooses what code to
        import; a class of yours must be passed as ``model_class``."""
        checkpoint = load_checkpoint(path)
        named = {f"{model_class.__module__}.{model_class.__qualname__}"} if model_class else set()
        check_names(checkpoint, path, named)
        preprocessing = ImagePreprocessing.of(checkpoint, str(path))
        model_class = model_class or task_class(checkpoint, str(path))
        try:
            # compiling pays off in training, not in a forward pass per request
            model = model_class.load_from_checkpoint(path, map_location="cpu", compile_net=False)
        except UserInputError:
            raise
        except (TypeError, RuntimeError, ValueError) as err:  # other arguments or weights than the class's
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserInputError(
                f"checkpoint {str(path)!r} does not fit {model_class.__name__} ({first.rstrip('.')}); "
                "pass the model_class it was trained with."
            ) from err
        return cls(model, preprocessing, batch_size)

    @property
    def labels(self) -> list[str]:
        return self.preprocessing.labels

    def read(self, images: Sequence[ImageInput], names: Sequence[str] | None = None) -> torch.Tensor:
        """Images → uint8 ``(N, H, W, C)``; ``names`` say what each is in a sentence (a file: its path)."""
        if names is None:
            names = [
                repr(str(i)) if isinstance(i, str | Path) else f"image {k}" for k, i in enumerate(images)
            ]
        height, width = self.preprocessing.size
        empty = torch.empty(0, height, width, self.preprocessing.channels, dtype=torch.uint8)
        pixels = [self.preprocessing.read(item, name) for item, name in zip(images, names, strict=True)]
        return torch.stack(pixels) if pixels else empty

    @torch.inference_mode()
    def outputs(self, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
        """uint8 ``(N, H, W, C)`` → the model's ``predict_step`` outputs, ``batch_size`` images per pass."""
        batches = pixels.split(self.batch_size) or (pixels,)
        outputs = [self.model.predict_step((self.graph.normalize(b),), i) for i, b in enumerate(batches)]
        return {key: torch.cat([o[key] for o in outputs]) for key in outputs[0]}

    def predict(self, images: Sequence[ImageInput]) -> pd.DataFrame:
        """One line per image, in order (see :func:`src.predict.prediction_frame`): ``path`` when all are
        files (as ``predict``'s CSV file), else ``row``, their positions; ``prediction``; probabilities."""
        files = all(isinstance(item, str | Path) for item in images)
        index = pd.Index(
            [str(i) for i in images] if files else range(len(images)), name="path" if files else "row"
        )
        return prediction_frame(self.outputs(self.read(images)), self.labels, index)


def task_class(checkpoint: dict[str, Any], path: str) -> type[BaseTask]:
    """The task class a checkpoint names, which :func:`check_names` has already found trusted."""
    class_path = class_saved_by_the_cli(checkpoint)
    if class_path is None:
        raise UserInputError(
            f"checkpoint {path!r} does not name its model class; pass model_class=YourTask to "
            "from_checkpoint."
        )
    found = resolve(class_path)
    if not (isinstance(found, type) and issubclass(found, BaseTask)):
        raise UserInputError(
            f"checkpoint {path!r} names {class_path!r}, which is not a task of this project."
        )
    return found
