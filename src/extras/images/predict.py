"""How an image run reads new images, for :class:`src.predict.Predictor` (and so the server and export).

```python
from src.predict import Predictor

predictor = Predictor.from_checkpoint("logs/images/version_0/checkpoints/last.ckpt")
predictor.predict(["cat.png", open("dog.jpg", "rb").read()])  # a DataFrame: prediction, probabilities
```

An image (a file, its bytes, or a Pillow image) is read by the one rule of :mod:`src.extras.images` in the
checkpoint's mode and, if the run resized its images (``data.image_size``), resized to its size, as
:class:`src.extras.images.ImageDataModule` reads files to train on and to predict
(:class:`ImagePreprocessing`). The pixels, uint8 ``(H, W, C)``, go through :class:`ImageGraph`: floats on
the 0…1 scale, standardized with the statistics fitted in the run, then the net. The exported graph is
that module.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from PIL import Image
from torch import nn

from src.errors import UserInputError
from src.extras.images import CHANNELS, FITTED, Mode, array_of, read_image, sized

#: an image as :meth:`src.predict.Predictor.predict` takes one: a file, its bytes, or a decoded image
ImageInput = Image.Image | str | Path | bytes


def image_state(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The fitted state an image run saved (where Lightning puts the DataModule's ``state_dict``), or None
    for a checkpoint of another kind of data."""
    for value in checkpoint.values():
        if isinstance(value, dict) and all(key in value for key in FITTED):
            return value
    return None


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
    #: an image has one target
    target_names: ClassVar[None] = None
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

    def stack(
        self, images: Sequence[ImageInput], names: Sequence[str] | None = None, report: Any = None
    ) -> torch.Tensor:
        """Images → uint8 ``(N, H, W, C)``; ``names`` say what each is in a sentence (a file: its path)."""
        if names is None:
            names = [
                repr(str(i)) if isinstance(i, str | Path) else f"image {k}" for k, i in enumerate(images)
            ]
        height, width = self.size
        empty = torch.empty(0, height, width, self.channels, dtype=torch.uint8)
        pixels = [self.read(item, name) for item, name in zip(images, names, strict=True)]
        return torch.stack(pixels) if pixels else empty

    def read(self, item: ImageInput, where: str) -> torch.Tensor:
        """One image, given as a file, its bytes or a Pillow image → uint8 ``(H, W, C)`` by the one rule
        (:func:`src.extras.images.read_image`); a file that is no image, or of another size when the run did
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

    def graph(self, model: nn.Module) -> "ImageGraph":
        """``model`` behind the run's normalization: uint8 pixels in, the model's output out."""
        return ImageGraph(model, self.mean, self.std)

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

    def __init__(self, model: nn.Module, mean: torch.Tensor, std: torch.Tensor) -> None:
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
