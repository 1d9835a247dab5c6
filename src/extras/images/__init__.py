"""Images for classification: class folders or a CSV → seeded stratified split → per-channel statistics
fitted on the training split → uint8 batches, augmented (training only) and normalized on the device.

The bundled example, used when neither ``folder`` nor ``csv`` is given, is scikit-learn's handwritten
digits written once as PNG files in class folders (:func:`write_digits`), then read back like any folder.
"""

import io
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import AttributeDict
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import Dataset
from typing_extensions import override

from src.checkpoints import load_checkpoint
from src.data.loading import (
    TESTED,
    TRAINED,
    VALIDATED,
    ResumableDataModule,
    Stage,
    TensorBatches,
    check_fractions,
    check_split,
    split_record,
)
from src.errors import UserInputError, notice
from src.files import TEMPORARY, alive, special_file, temporary_name

if TYPE_CHECKING:
    from src.extras.images.predict import ImagePreprocessing

#: what the net reads: grayscale (1 channel), colour (3), or colour with alpha kept as a fourth channel
Mode = Literal["L", "RGB", "RGBA"]
CHANNELS: dict[Mode, int] = {"L": 1, "RGB": 3, "RGBA": 4}
#: Pillow modes in colour; every other mode (1, L, LA, I, I;16, F, ...) is gray
COLOUR = frozenset({"RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV", "P", "PA"})
#: Pillow modes with an alpha channel (an image of another mode may name one colour transparent:
#: ``info["transparency"]``, a PNG's tRNS chunk)
ALPHA = frozenset({"LA", "La", "PA", "RGBA", "RGBa"})
#: the gray level that transparency is composited on in the modes without alpha: white, as a viewer
#: shows a transparent image on a white page
BACKGROUND = 255
#: the EXIF orientations that turn an image a quarter, swapping its width and height
QUARTER_TURNS = frozenset({5, 6, 7, 8})
#: how every image is read, in words: training, predict, the server and the export's sidecar say the same
RULE = (
    "EXIF orientation applied; 16-bit and 32-bit integer pixels scaled from 0…65535 and float pixels from "
    "0…1 to 0…255; a palette, CMYK or YCbCr image converted to RGB; transparency kept as a fourth channel "
    "in RGBA, composited on white in L and RGB"
)
ROOT = Path(__file__).resolve().parents[3]  # src/extras/<extra>/__init__.py: the repository
#: where the bundled example is written, once, and read from
EXAMPLE = ROOT / "data" / "digits-images"
EXAMPLE_SIZE = 32
#: the file that marks a folder as written by :func:`write_digits` (whole: it is renamed into place)
MARK = "WRITTEN_BY_SRC_DATA_IMAGES"
#: what the state dict holds besides the generators: everything fitted on the training split
FITTED = ("label_names", "mode", "size", "mean", "std")


def image_suffixes() -> frozenset[str]:
    """The file suffixes Pillow can open (``.png``, ``.jpg``, ...), lower case."""
    return frozenset(ext for ext, kind in Image.registered_extensions().items() if kind in Image.OPEN)


def images_in(folder: Path) -> list[Path]:
    """The image files under ``folder``, at any depth, sorted; hidden files and folders left out. One with
    an image's name that is no regular file (a FIFO, a device, a socket, a broken link) is refused: it
    would block or fail the read."""
    suffixes = image_suffixes()
    found = []
    for path in folder.rglob("*"):
        if path.suffix.lower() not in suffixes or any(
            part.startswith(".") for part in path.relative_to(folder).parts
        ):
            continue
        if path.is_file():
            found.append(path)
        elif (kind := special_file(path)) is not None:
            raise UserInputError(
                f"{str(path)!r} is {kind}, not an image file; remove it from {str(folder)!r}."
            )
    return sorted(found)


def write_digits(folder: Path = EXAMPLE, size: int = EXAMPLE_SIZE) -> Path:
    """scikit-learn's digits (1797 images of 8x8) as ``size`` x ``size`` grayscale PNGs in class folders
    ``0`` … ``9``, written once.

    The folder is written under a temporary name beside it and renamed into place when whole, so a
    killed run leaves no half-written folder (the temporary one of a process that is gone is removed
    by the next call). A folder already there is used as it is if this function wrote it, and refused
    otherwise: nothing of anyone else's is overwritten.
    """
    if folder.exists():
        if not (folder / MARK).is_file():
            raise UserInputError(
                f"{str(folder)!r} exists but was not written by src.extras.images (it has no {MARK} file); "
                "move it away to get the bundled example there, or pass data.folder."
            )
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    for leftover in folder.parent.glob(f".{folder.name}.partial-*"):
        match = TEMPORARY.match(leftover.name)
        if match and leftover.is_dir() and not alive(int(match.group(1))):
            shutil.rmtree(leftover, ignore_errors=True)
    partial = temporary_name(folder)
    shutil.rmtree(partial, ignore_errors=True)
    try:
        digits = load_digits()
        pixels = np.rint(digits.images * (255 / 16)).astype(np.uint8)  # (N, 8, 8): 0…16 → 0…255
        for index, (image, target) in enumerate(zip(pixels, digits.target, strict=True)):
            (partial / str(target)).mkdir(parents=True, exist_ok=True)
            big = Image.fromarray(image).resize((size, size), Image.Resampling.BILINEAR)
            big.save(partial / str(target) / f"{index:04d}.png")
        (partial / MARK).write_text(f"scikit-learn's digits as {size}x{size} PNG files; safe to delete.\n")
        try:
            partial.rename(folder)
        except OSError:
            if not (folder / MARK).is_file():  # not another process of this run that got there first
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


@dataclass(frozen=True)
class Source:
    """The labelled image files: where they came from (for sentences), their paths and their labels."""

    where: str
    paths: list[Path]
    labels: np.ndarray  # (N,) str, as the class folders or the CSV name them
    root: Path  # the folder, or the CSV's folder (which its relative paths are read from)

    def names(self) -> list[str]:
        """Each image's path as the data names it: inside the folder, or as its CSV row writes it."""
        return [
            (path.relative_to(self.root) if path.is_relative_to(self.root) else path).as_posix()
            for path in self.paths
        ]


def folder_source(folder: Path, where: str) -> Source:
    """One sub-folder per class; its images at any depth inside it."""
    if not folder.is_dir():
        raise UserInputError(
            f"{where} is not a folder; give a folder with one sub-folder of images per class."
        )
    classes = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise UserInputError(
            f"{where} holds no images in class sub-folders; put each class's images in a sub-folder named "
            "after the class."
        )
    paths: list[Path] = []
    labels: list[str] = []
    for class_folder in classes:
        found = images_in(class_folder)
        if not found:
            raise UserInputError(
                f"{where}: the class folder {class_folder.name!r} holds no images; add some or remove it."
            )
        paths += found
        labels += [class_folder.name] * len(found)
    return Source(where, paths, np.array(labels, dtype=object), folder)


def csv_source(csv: Path, where: str) -> Source:
    """A CSV of ``path,label`` rows; a relative path is relative to the CSV's folder."""
    if (kind := special_file(csv)) is not None:
        raise UserInputError(f"{where} is {kind}, not a file; give a CSV file of path,label rows.")
    if not csv.is_file():
        raise UserInputError(f"{where} does not exist; give a CSV file of path,label rows.")
    try:
        frame = pd.read_csv(csv, dtype=str, keep_default_na=False)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as err:
        raise UserInputError(
            f"{where} cannot be read as CSV ({err}); give a CSV of path,label rows."
        ) from err
    missing = [column for column in ("path", "label") if column not in frame.columns]
    if missing:
        raise UserInputError(
            f"{where} has no {' or '.join(repr(m) for m in missing)} column (its columns: "
            f"{list(frame.columns)}); give a header line naming the columns path and label."
        )
    if frame.empty:
        raise UserInputError(f"{where} holds no rows; list one image per row, as path,label.")
    paths = [csv.parent / path for path in frame["path"]]  # an absolute path stays as it is
    for row, path in enumerate(paths):
        if (kind := special_file(path)) is not None:
            raise UserInputError(
                f"{where} row {row + 1} names {str(path)!r}, which is {kind}, not an image file; name a "
                "regular file."
            )
        if not path.is_file():
            raise UserInputError(
                f"{where} row {row + 1} names {str(path)!r}, which does not exist (relative paths are read "
                "from the CSV's folder)."
            )
    return Source(where, paths, frame["label"].to_numpy(dtype=object), csv.parent)


@dataclass(frozen=True)
class Header:
    """What an image file's header says, before any pixel is decoded.

    Attributes:
        mode: Pillow's mode of the file (``L``, ``I;16``, ``RGBA``, ``P``, ...).
        size: ``(H, W)`` as a viewer shows it: EXIF orientation applied.
        alpha: Whether it has an alpha channel or names a transparent colour.
    """

    mode: str
    size: tuple[int, int]
    alpha: bool

    @property
    def colour(self) -> bool:
        return self.mode in COLOUR

    @property
    def pixels(self) -> int:
        return self.size[0] * self.size[1]


def mode_of(headers: Iterable[Header]) -> Mode:
    """The mode that loses nothing of any image: ``RGB`` if one is in colour, else ``L``; ``RGBA`` if one
    has transparency."""
    headers = list(headers)
    if any(h.alpha for h in headers):
        return "RGBA"
    return "RGB" if any(h.colour for h in headers) else "L"


def orientation(image: Image.Image) -> int:
    """The EXIF orientation a viewer applies (1 to 8; 1: as stored), read from an opened file's header.

    A PNG's EXIF is read only where it comes before the pixels (Pillow would decode the whole file to
    look for one after them). Unreadable or unknown EXIF is orientation 1: a viewer shows the pixels as
    stored.
    """
    if image.format == "PNG" and "exif" not in image.info:
        return 1
    try:
        value = image.getexif().get(ExifTags.Base.Orientation, 1)
    except Exception:  # EXIF is metadata: a broken one leaves the pixels readable, as in a viewer
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def eight_bit(image: Image.Image) -> Image.Image:
    """A gray image of more than 8 bits as ``L``, scaled rather than clipped: integers (``I;16``, ``I``)
    from 0…65535, floats (``F``) from 0…1, to 0…255, rounded; values outside those ranges clip."""
    if image.mode == "F":
        values = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0).clip(0, 1) * 255
    elif image.mode.startswith("I"):
        values = np.asarray(image, dtype=np.float64).clip(0, 65535) / 257  # 65535 / 255 = 257
    else:
        return image
    return Image.fromarray(np.rint(values).astype(np.uint8), "L")


def viewed(image: Image.Image, mode: Mode, turn: int = 1) -> Image.Image:
    """The one reading rule: a decoded image as a viewer shows it, 8 bits per channel, in ``mode``.

    The EXIF orientation ``turn`` is applied; wide gray pixels are scaled (:func:`eight_bit`); a palette,
    CMYK or YCbCr image becomes RGB by Pillow's conversions. ``RGBA`` keeps transparency as a fourth
    channel (255 where an image has none); ``L`` and ``RGB`` composite it on white (:data:`BACKGROUND`).
    """
    if turn != 1:
        image = ImageOps.exif_transpose(image)
    image = eight_bit(image)
    transparent = image.mode in ALPHA or "transparency" in image.info
    if mode == "RGBA" or transparent:
        rgba = image.convert("RGBA")
        if mode == "RGBA":
            return rgba
        white = Image.new("RGBA", rgba.size, (BACKGROUND,) * 4)
        image = Image.alpha_composite(white, rgba)  # opaque: the RGB a viewer shows on white
    return image.convert(mode)


def special_source(source: Path | bytes | Image.Image, where: str) -> None:
    """One sentence for a path that is no regular file (a FIFO or a device would block the read for
    ever), before anything is opened."""
    if isinstance(source, Path) and (kind := special_file(source)) is not None:
        raise UserInputError(f"{where} is {kind}, not an image file; name a regular file.")


@contextmanager
def readable(where: str, fix: str) -> Iterator[None]:
    """Every way Pillow can refuse or fail on a file, as one sentence naming ``where`` and ending in
    ``fix``: its plugins raise UnidentifiedImageError, OSError (truncated data), SyntaxError (a broken
    chunk), ValueError and struct.error (a chunk of the wrong length), EOFError, IndexError,
    DecompressionBombError (more pixels than ``PIL.Image.MAX_IMAGE_PIXELS`` allows) and more, so what
    runs inside is Pillow's reading of one file alone."""
    try:
        yield
    except UserInputError:
        raise
    except Image.DecompressionBombError as err:
        raise UserInputError(
            f"{where} has more pixels than Pillow decodes ({str(err).rstrip('.')}); shrink it, or raise "
            "PIL.Image.MAX_IMAGE_PIXELS if you trust the file."
        ) from err
    except Exception as err:
        # Pillow names an unknown format by the file object's repr: say it in words instead
        why = "no image format Pillow reads" if isinstance(err, UnidentifiedImageError) else str(err)
        raise UserInputError(
            f"{where} cannot be read as an image ({why.rstrip('.') or type(err).__name__}); {fix}."
        ) from err


def opened(source: Path | bytes) -> Image.Image:
    """``Image.open`` of a file or of a file's bytes (header only; nothing is decoded yet)."""
    return Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)


def header(source: Path | bytes, where: str | None = None, fix: str = "replace or remove it") -> Header:
    """An image file's (or its bytes') :class:`Header`, from its header only."""
    where = where or repr(str(source))
    special_source(source, where)
    with readable(where, fix), opened(source) as image:
        turn = orientation(image)
        height, width = (image.width, image.height) if turn in QUARTER_TURNS else (image.height, image.width)
        alpha = image.mode in ALPHA or "transparency" in image.info
        return Header(image.mode, (height, width), alpha)


def read_image(
    source: Path | bytes | Image.Image,
    mode: Mode,
    where: str | None = None,
    fix: str = "replace or remove it",
) -> Image.Image:
    """A file, its bytes or a Pillow image → decoded by :func:`viewed`, at its own size; one sentence
    naming ``where`` (by default the path) for anything Pillow cannot read."""
    where = where or repr(str(source))
    special_source(source, where)
    with readable(where, fix):
        if isinstance(source, Image.Image):
            return viewed(source, mode, orientation(source))
        with opened(source) as image:
            turn = orientation(image)  # before decoding, as the header read it
            image.load()  # decodes: a damaged file fails here
            return viewed(image, mode, turn)


def sized(image: Image.Image, size: tuple[int, int], resize: bool) -> Image.Image | None:
    """``image`` at ``size`` (H, W): as it is, resized (bilinear) when ``resize``, else None."""
    height, width = size
    if image.size == (width, height):
        return image
    return image.resize((width, height), Image.Resampling.BILINEAR) if resize else None


def array_of(image: Image.Image) -> np.ndarray:
    """An 8-bit image → uint8 ``(H, W, C)`` (a grayscale image gets its channel axis)."""
    return np.asarray(image).reshape(image.height, image.width, -1)


def decode(path: Path, mode: Mode, size: tuple[int, int], resize: bool) -> torch.Tensor:
    """One image file as a ``(C, H, W)`` uint8 tensor, read by :func:`viewed` in ``mode``, of ``size`` (H, W).

    With ``resize``, an image of another size is resized (bilinear); without, it is refused.
    """
    image = read_image(path, mode)
    fitting = sized(image, size, resize)
    if fitting is None:
        height, width = size
        raise UserInputError(
            f"{str(path)!r} is {image.width}x{image.height} but the images are {width}x{height}; set "
            f"data.image_size to resize them all to one size."
        )
    return torch.from_numpy(array_of(fitting).copy()).permute(2, 0, 1).contiguous()


class ImageFiles(Dataset[tuple[torch.Tensor, ...]]):
    """Image files decoded when a batch is asked for (in the loader's workers, if it has any).

    Args:
        paths: The image files.
        targets: ``(N,)`` class ids, or ``None`` for images to predict (batches are then ``(x,)``).
        mode: ``L`` or ``RGB``.
        size: (H, W) of every image.
        resize: Resize images of another size instead of refusing them.
    """

    def __init__(
        self,
        paths: Sequence[Path],
        targets: torch.Tensor | None,
        mode: Mode,
        size: tuple[int, int],
        resize: bool,
    ) -> None:
        self.paths = list(paths)
        self.targets = targets
        self.mode: Mode = mode
        self.size = size
        self.resize = resize

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        x = decode(self.paths[index], self.mode, self.size, self.resize)
        return (x,) if self.targets is None else (x, self.targets[index])

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        # the batch stacked here, so that both datasets of this module share keep_batch as collate
        x = torch.stack([decode(self.paths[i], self.mode, self.size, self.resize) for i in indices])
        return (x,) if self.targets is None else (x, self.targets[torch.as_tensor(indices)])


def channel_stats(batches: Iterable[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and (population) standard deviation of uint8 ``(B, C, H, W)`` batches, on the
    0…1 scale, summed in float64; a channel of one value gets the standard deviation 1."""
    total = squares = None
    count = 0
    for batch in batches:
        x = batch.to(torch.float64) / 255
        sums, sums_of_squares = x.sum(dim=(0, 2, 3)), x.square().sum(dim=(0, 2, 3))  # (C,)
        total = sums if total is None else total + sums
        squares = sums_of_squares if squares is None else squares + sums_of_squares
        count += x.numel() // x.shape[1]
    assert total is not None, "the training split is never empty"
    assert squares is not None
    mean = total / count
    std = (squares / count - mean.square()).clamp_min(0).sqrt()
    std[std == 0] = 1.0
    return mean.float(), std.float()


class ImageDataModule(ResumableDataModule):
    """Labelled images: one sub-folder per class, a CSV of ``path,label`` rows, or the bundled digits.

    Images are decoded with Pillow by one rule (:func:`viewed`), in ``mode``; all must have one size, or
    ``image_size`` resizes them. The per-channel mean and standard deviation are fitted on the training
    split only and saved in every checkpoint with the label names, the mode and the size, so a checkpoint
    alone predicts new images as the run saw them. Batches leave the loaders as uint8 ``(B, C, H, W)`` and
    ``(B,)`` class ids; once on the device they become floats, augmented in training (a random crop of the
    image padded with ``crop_padding`` black pixels, and with ``horizontal_flip`` a mirror image half the
    time) and normalized. Augmentation draws from a generator of this module, saved in checkpoints, so a
    resumed run crops as the uninterrupted one would have.

    Args:
        folder: A folder with one sub-folder per class, the images inside it (at any depth); the class
            names are the sub-folders' names.
        csv: A CSV file of ``path,label`` rows instead; a relative path is read from the CSV's folder.
            Left out both: scikit-learn's digits, written once as 32x32 PNG files into
            ``data/digits-images/`` and read from there.
        mode: ``L`` (grayscale, 1 channel), ``RGB`` (3) or ``RGBA`` (4: transparency kept as a channel);
            left out, the one that loses nothing of any image (from their headers): ``RGB`` if one is in
            colour, else ``L``, and ``RGBA`` if one has transparency. Every file is read by one rule
            (:func:`viewed`): as a viewer shows it, EXIF orientation applied, 16-bit and float pixels
            scaled to 8 bits, transparency composited on white in ``L`` and ``RGB``.
        image_size: Resize every image to ``image_size`` x ``image_size``; left out, all images must have
            one size.
        predict_path: What ``predict`` predicts: a folder of images (at any depth, sorted), one image file,
            or a list of image files. Left out, the validation split (never the test split).
        preprocessing_from: A checkpoint whose fitted state (labels, mode, size, statistics) to use
            instead of fitting one; the CLI sets it to ``--ckpt_path``.
        val_fraction: Share of all images held out for validation.
        test_fraction: Share of all images held out for the final test; touched only by ``test``.
        seed: Seeds the split, the training shuffle and the augmentation.
        crop_padding: Training images are padded by this many pixels on each side and cropped back to
            their size at a random place; 0 turns the crop off.
        horizontal_flip: Mirror training images left to right half the time (not for digits or text).
        batch_size: Images per batch, per process.
        in_memory: Decode every image once and keep them in memory as uint8; ``false`` decodes each
            batch's images from their files in the loader (for data larger than memory: give workers).
        num_workers: Loader worker processes; 0 loads in the main process (best for images in memory,
            see ``src/extras/images/bench.py``).
        drop_last: Drop the last, smaller training batch of each epoch.
        resplit_on_resume: Let a resumed fit go on with other images or split settings than its
            checkpoint's run split them with (images it held out may then be trained on); left false,
            such a resume is refused.
    """

    @classmethod
    def reading_of(cls, checkpoint: dict[str, Any], path: str) -> "ImagePreprocessing":
        """How the checkpoint's run reads new images (:class:`src.predict.Predictor` asks)."""
        from src.extras.images.predict import ImagePreprocessing  # it imports this module

        return ImagePreprocessing.of(checkpoint, path)

    def __init__(
        self,
        folder: str | None = None,
        csv: str | None = None,
        mode: Mode | None = None,
        image_size: int | None = None,
        predict_path: str | list[str] | None = None,
        preprocessing_from: str | None = None,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        seed: int = 42,
        crop_padding: int = 2,
        horizontal_flip: bool = False,
        batch_size: int = 64,
        in_memory: bool = True,
        num_workers: int = 0,
        drop_last: bool = False,
        resplit_on_resume: bool = False,
    ) -> None:
        super().__init__(seed, batch_size, num_workers, drop_last)
        if folder is not None and csv is not None:
            raise UserInputError(f"data.folder={folder!r} and data.csv={csv!r} are both set; give one.")
        check_fractions(val_fraction, test_fraction, "images")
        if mode is not None and mode not in CHANNELS:
            raise UserInputError(
                f"data.mode={mode!r} is unknown; choose L (grayscale), RGB or RGBA (alpha kept as a channel)."
            )
        for name, value, least in (
            ("image_size", image_size, 1),
            ("crop_padding", crop_padding, 0),
        ):
            if value is not None and value < least:
                raise UserInputError(f"data.{name}={value} must be at least {least}.")
        if predict_path is not None:
            for given in [predict_path] if isinstance(predict_path, str) else predict_path:
                if (kind := special_file(Path(given))) is not None:
                    raise UserInputError(
                        f"data.predict_path={given!r} is {kind}; name a folder of images, an image file, "
                        "or a list of image files."
                    )
                if not Path(given).exists():
                    raise UserInputError(
                        f"data.predict_path={given!r} does not exist; name a folder of images, an image "
                        "file, or a list of image files."
                    )
        self.save_hyperparameters()
        self._datasets: dict[Stage, Dataset] = {}
        self._augment = torch.Generator().manual_seed(seed)

    @property
    def settings(self) -> AttributeDict:
        """The ``__init__`` arguments, as saved by ``save_hyperparameters`` (typed for attribute access)."""
        return cast(AttributeDict, self.hparams)

    # -- the files ------------------------------------------------------------------------------------

    @cached_property
    def source(self) -> Source:
        """The labelled image files (for the bundled example, written first if missing)."""
        hp = self.settings
        if hp.csv is not None:
            return csv_source(Path(hp.csv), f"data.csv={hp.csv!r}")
        if hp.folder is not None:
            return folder_source(Path(hp.folder), f"data.folder={hp.folder!r}")
        return folder_source(write_digits(), f"the bundled example {str(EXAMPLE)!r}")

    @cached_property
    def targets(self) -> torch.Tensor:
        """``(N,)`` class ids of :attr:`source`'s images, by position in :attr:`label_names`."""
        source, names = self.source, self.label_names
        ids = {name: k for k, name in enumerate(names)}
        unknown = sorted({str(label) for label in source.labels} - ids.keys())
        if unknown:
            raise UserInputError(
                f"{source.where} holds the classes {unknown}, which the checkpoint "
                f"{self.settings.preprocessing_from!r} was not trained on (its classes: {names})."
            )
        return torch.tensor([ids[str(label)] for label in source.labels], dtype=torch.long)

    @cached_property
    def split_items(self) -> dict[str, np.ndarray]:
        """Disjoint, sorted positions into :attr:`source` per split; seeded and stratified by class."""
        hp, source = self.settings, self.source
        positions = np.arange(len(source.paths))
        labels = source.labels.astype(str)
        try:
            rest, test = train_test_split(
                positions, test_size=hp.test_fraction, random_state=hp.seed, stratify=labels
            )
            train, val = train_test_split(
                rest,
                test_size=hp.val_fraction / (1 - hp.test_fraction),
                random_state=hp.seed,
                stratify=labels[rest],
            )
        except ValueError as err:
            names, counts = np.unique(labels, return_counts=True)
            smallest = str(names[counts.argmin()])
            raise UserInputError(
                f"{source.where} cannot be split with val_fraction={hp.val_fraction} and test_fraction="
                f"{hp.test_fraction}, stratified by class ({err}); its smallest class {smallest!r} has "
                f"{counts.min()} image(s): add images or remove that class."
            ) from err
        return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}

    @cached_property
    def split_record(self) -> dict[str, Any]:
        """What the split was made from, saved in every checkpoint for a resumed fit to compare
        (:func:`check_split`): a hash of each image's path (:meth:`Source.names`), label and file size,
        the split it went to, and the settings that split them."""
        source, hp = self.source, self.settings
        # the size from a stat, not the bytes: hashing the pixels would read every image once more at
        # each setup, a pass over a large data set (a file rewritten to the same size goes unseen)
        sizes = [path.stat().st_size for path in source.paths]
        frame = pd.DataFrame({"path": source.names(), "label": source.labels.astype(str), "bytes": sizes})
        splits = np.full(len(frame), TRAINED, np.uint8)
        splits[self.split_items["val"]] = VALIDATED
        splits[self.split_items["test"]] = TESTED
        settings = {
            "data.seed": hp.seed,
            "data.val_fraction": hp.val_fraction,
            "data.test_fraction": hp.test_fraction,
        }
        return split_record(pd.util.hash_pandas_object(frame, index=False).to_numpy(), splits, settings)

    # -- what is fitted (or read from preprocessing_from's checkpoint) -------------------------------

    @cached_property
    def checkpoint_state(self) -> dict[str, Any]:
        """The fitted state in ``preprocessing_from``'s checkpoint (where Lightning saved ``state_dict``)."""
        path = self.settings.preprocessing_from
        for value in load_checkpoint(path).values():
            if isinstance(value, dict) and all(key in value for key in FITTED):
                return value
        raise UserInputError(
            f"checkpoint {path!r} carries no fitted image statistics (it was not written by a run of "
            "ImageDataModule); train a new one."
        )

    @cached_property
    def label_names(self) -> list[str]:
        """Class names in class-id order: the class folders' names, or the CSV's labels, sorted."""
        if self.settings.preprocessing_from is not None:
            return list(self.checkpoint_state["label_names"])
        names = sorted({str(label) for label in self.source.labels})
        if len(names) < 2:
            raise UserInputError(
                f"{self.source.where} holds {len(names)} class ({names}); classification needs at least 2."
            )
        return names

    @cached_property
    def headers(self) -> list[Header]:
        """Every image's :class:`Header`, read once (no pixel decoded); a notice when they mix modes."""
        found = [header(path) for path in self.source.paths]
        modes = Counter(h.mode for h in found)
        if len(modes) > 1:
            examples = {
                h.mode: path for h, path in zip(reversed(found), reversed(self.source.paths), strict=True)
            }
            listed = ", ".join(
                f"{n} {mode} (e.g. {str(examples[mode])!r})" for mode, n in modes.most_common()
            )
            notice(
                f"{self.source.where} mixes image modes: {listed}; all are read as "
                f"{self.settings.mode or mode_of(found)} by one rule ({RULE})."
            )
        return found

    @cached_property
    def mode(self) -> Mode:
        """``L``, ``RGB`` or ``RGBA``: the checkpoint's, the one given, or the one that loses nothing of any
        image (:func:`mode_of`)."""
        if self.settings.preprocessing_from is not None:
            return cast(Mode, self.checkpoint_state["mode"])
        if self.settings.mode is not None:
            return cast(Mode, self.settings.mode)
        return mode_of(self.headers)

    @cached_property
    def size(self) -> tuple[int, int]:
        """(H, W) of every image: the checkpoint's, ``image_size``'s, or the one all images share."""
        hp = self.settings
        if hp.preprocessing_from is not None:
            height, width = self.checkpoint_state["size"]
            if hp.image_size is not None and (hp.image_size, hp.image_size) != (height, width):
                raise UserInputError(
                    f"data.image_size={hp.image_size} differs from the {width}x{height} images the "
                    f"checkpoint {hp.preprocessing_from!r} was trained on; leave it out or set {height}."
                )
            return int(height), int(width)
        headers = self.headers  # headers only: a mixed folder is refused before anything is decoded
        if hp.image_size is not None:
            return hp.image_size, hp.image_size
        paths, first = self.source.paths, headers[0].size
        for path, each in zip(paths[1:], headers[1:], strict=True):
            if each.size != first:
                raise UserInputError(
                    f"{self.source.where} holds images of different sizes: {str(paths[0])!r} is "
                    f"{first[1]}x{first[0]} and {str(path)!r} is {each.size[1]}x{each.size[0]}; set "
                    "data.image_size to resize them all to one size."
                )
        return first

    @cached_property
    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel ``(C,)`` mean and standard deviation on the 0…1 scale, of the training split."""
        if self.settings.preprocessing_from is not None:
            state = self.checkpoint_state
            return state["mean"].float().clone(), state["std"].float().clone()
        train = self.dataset("train")
        assert isinstance(train, TensorBatches | ImageFiles)
        chunks = (list(range(start, min(start + 512, len(train)))) for start in range(0, len(train), 512))
        return channel_stats(train.__getitems__(chunk)[0] for chunk in chunks)

    @property
    def in_features(self) -> int:
        """Input channels: 1 for ``L``, 3 for ``RGB``, 4 for ``RGBA`` (from headers or the checkpoint)."""
        return CHANNELS[self.mode]

    @property
    def out_features(self) -> int:
        """Class count: the width of the net's head."""
        return len(self.label_names)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` floats on the 0…1 scale → standardized with the training statistics."""
        mean, std = (s.to(x.device, x.dtype).view(1, -1, 1, 1) for s in self.stats)
        return (x - mean) / std

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`normalize`: what a batch looked like on the 0…1 scale, for display."""
        mean, std = (s.to(x.device, x.dtype).view(1, -1, 1, 1) for s in self.stats)
        return x * std + mean

    # -- predict --------------------------------------------------------------------------------------

    @cached_property
    def predict_paths(self) -> list[Path]:
        """The images ``predict`` predicts: ``predict_path``'s, or the validation split's."""
        given = self.settings.predict_path
        if given is None:
            return [self.source.paths[i] for i in self.split_items["val"]]
        paths: list[Path] = []
        for each in [given] if isinstance(given, str) else given:
            path = Path(each)
            found = images_in(path) if path.is_dir() else [path]
            if not found:
                raise UserInputError(f"data.predict_path={each!r} holds no images; name a folder of images.")
            paths += found
        return paths

    def predict_index(self) -> pd.Index:
        """One entry per predicted image, in order: its path (the first column of predict's CSV file)."""
        return pd.Index([str(path) for path in self.predict_paths], name="path")

    # -- datasets -------------------------------------------------------------------------------------

    def dataset(self, stage: Stage) -> Dataset:
        """One split's images (built once): ``(x, y)`` batches, or ``(x,)`` for ``predict``."""
        if stage not in self._datasets:
            if stage == "predict":
                paths, targets = self.predict_paths, None
            else:
                positions = self.split_items[stage]
                paths = [self.source.paths[i] for i in positions]
                targets = self.targets[torch.from_numpy(positions)]
            files = ImageFiles(paths, targets, self.mode, self.size, self.settings.image_size is not None)
            if self.settings.in_memory:
                x = files.__getitems__(list(range(len(files))))[0]  # (N, C, H, W) uint8, decoded once
                self._datasets[stage] = TensorBatches(x) if targets is None else TensorBatches(x, targets)
            else:
                self._datasets[stage] = files
        return self._datasets[stage]

    @override
    def setup(self, stage: str) -> None:
        # what the run needs, built now: bad files fail before the first step, not in the middle
        self.stats  # noqa: B018  (fitted on the training split, or read from the checkpoint)
        needed: dict[str, tuple[Stage, ...]] = {
            "fit": ("train", "val"),
            "validate": ("val",),
            "test": ("test",),
            "predict": ("predict",),
        }
        for split in needed.get(stage, ()):
            self.dataset(split)

    # -- checkpoints ----------------------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        """Saved in every checkpoint: what was fitted (label names, mode, size, statistics) as tensors and
        plain data, what the split was made from, and the shuffle and augmentation generators' states,
        for an exact resume."""
        mean, std = self.stats
        return {
            "label_names": list(self.label_names),
            "mode": self.mode,
            "size": list(self.size),
            "mean": mean.clone(),
            "std": std.clone(),
            "split": self.split_record,
            "augment": self._augment.get_state(),
            **super().state_dict(),
        }

    @override
    def check_resume(self, state_dict: dict[str, Any]) -> None:
        """A resumed fit goes on with its run's split (:func:`check_split`)."""
        check_split(
            state_dict.get("split"), self.split_record, self.settings.resplit_on_resume, "image",
            "data.resplit_on_resume",
        )  # fmt: skip

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A resumed fit goes on with its run's split (:meth:`check_resume`, first); a checkpoint's fitted
        state wins over one fitted anew (say, for an evaluation on a folder that changed since)."""
        super().load_state_dict(state_dict)
        if list(state_dict["label_names"]) != self.__dict__.get("label_names"):
            self._datasets.clear()
            self.__dict__.pop("targets", None)
        self.__dict__.update(
            label_names=list(state_dict["label_names"]),
            mode=state_dict["mode"],
            size=tuple(int(n) for n in state_dict["size"]),
            stats=(state_dict["mean"].float().clone(), state_dict["std"].float().clone()),
        )
        self._augment.set_state(state_dict["augment"])

    # -- batches --------------------------------------------------------------------------------------

    @override
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # on the device: (B, C, H, W) uint8 → floats, augmented in training only, normalized
        x = batch[0].float() / 255
        if self.trainer is not None and self.trainer.training:
            x = self.augment(x)
        return (self.normalize(x), *batch[1:])

    def augment(self, x: torch.Tensor) -> torch.Tensor:
        """A random crop of ``x`` padded by ``crop_padding`` black pixels, and, with ``horizontal_flip``, a
        mirror image for half of the batch. ``(B, C, H, W)`` on the 0…1 scale in and out.

        The draws come from this module's generator on the CPU (one draw per training batch, whatever
        the device), which checkpoints save: a resumed run crops as the uninterrupted one. Under DDP
        every process draws the same offsets, for its own images.
        """
        batch, channels, height, width = x.shape
        pad = self.settings.crop_padding
        if pad > 0:
            offsets = torch.randint(0, 2 * pad + 1, (2, batch), generator=self._augment).to(x.device)
            padded = F.pad(x, (pad, pad, pad, pad))  # (B, C, H + 2p, W + 2p)
            rows = offsets[0, :, None] + torch.arange(height, device=x.device)  # (B, H)
            cols = offsets[1, :, None] + torch.arange(width, device=x.device)  # (B, W)
            x = padded[
                torch.arange(batch, device=x.device)[:, None, None, None],
                torch.arange(channels, device=x.device)[None, :, None, None],
                rows[:, None, :, None],
                cols[:, None, None, :],
            ]  # (B, C, H, W)
        if self.settings.horizontal_flip:
            flip = (torch.rand(batch, generator=self._augment) < 0.5).to(x.device)
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        return x


assert set(CHANNELS) == set(get_args(Mode))
