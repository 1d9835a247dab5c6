"""Text for a character language model: one text → contiguous splits → a vocabulary fitted on train →
windows of ``block_size`` characters, each with the next character at every position as its target.

Left without a file, the DataModule reads the text that ships with Python itself: the standard
library's help topics (``pydoc_data.topics``, about 465 000 characters of English and code).
"""

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
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
from src.files import special_file

#: the id of every character outside the vocabulary; the vocabulary's characters follow from id 1
UNKNOWN_ID = 0
#: how the unknown id reads when decoded: Unicode's replacement character
UNKNOWN_TEXT = "\ufffd"


@dataclass(frozen=True)
class Vocabulary:
    """Characters ↔ ids: id 0 is "unknown", the known characters follow in code-point order from id 1.

    Args:
        characters: The known characters, each once, in code-point order.
    """

    characters: tuple[str, ...]

    @classmethod
    def fit(cls, text: str, min_count: int = 1) -> "Vocabulary":
        """The characters that occur at least ``min_count`` times in ``text``."""
        counts = Counter(text)
        return cls(tuple(sorted(c for c, n in counts.items() if n >= min_count)))

    def __len__(self) -> int:
        """Ids in all: the known characters and the unknown id."""
        return len(self.characters) + 1

    @cached_property
    def _code_points(self) -> np.ndarray:
        return np.array([ord(c) for c in self.characters], dtype=np.int64)  # sorted, as the characters

    def encode(self, text: str) -> torch.Tensor:
        """``text`` → ``(len(text),)`` int64 ids; characters outside the vocabulary become ``UNKNOWN_ID``."""
        # one code point per character (UTF-32), looked up by binary search in the sorted code points
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        known = self._code_points
        at = np.searchsorted(known, points).clip(max=max(len(known) - 1, 0))
        found = known[at] == points if len(known) else np.zeros(len(points), dtype=bool)
        return torch.from_numpy(np.where(found, at + 1, UNKNOWN_ID))

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        """Ids → text; the unknown id reads as ``UNKNOWN_TEXT`` (U+FFFD)."""
        table = (UNKNOWN_TEXT, *self.characters)
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return "".join(table[i] for i in values)

    @property
    def labels(self) -> list[str]:
        """What each id stands for, in id order."""
        return [UNKNOWN_TEXT, *self.characters]


def bundled_text() -> str:
    """Python's own help topics (``pydoc_data.topics.topics``), in sorted key order, a blank line apart."""
    from pydoc_data.topics import topics

    return "\n".join(topics[key] for key in sorted(topics))


def read_text(path: str, key: str = "data.path") -> str:
    """A UTF-8 text file, or one sentence naming it: missing, a folder, a FIFO or a device (refused before
    it is opened), empty, binary or not UTF-8."""
    file = Path(path)
    named = f"{key}={path!r}"
    if (kind := special_file(file)) is not None:
        raise UserInputError(f"{named} is {kind}, not a file; name a UTF-8 text file.")
    if file.is_dir():
        raise UserInputError(f"{named} is a folder; name a UTF-8 text file.")
    if not file.is_file():
        raise UserInputError(f"{named} does not exist; name a UTF-8 text file.")
    raw = file.read_bytes()
    if not raw:
        raise UserInputError(f"{named} is empty (0 bytes); name a file that holds text.")
    if b"\x00" in raw:  # valid UTF-8, but UTF-8 text holds no NUL bytes: an image, an archive, a checkpoint
        raise UserInputError(
            f"{named} is a binary file (it holds NUL bytes), not UTF-8 text; name a UTF-8 text file (a "
            "UTF-16 one converts with iconv -t UTF-8)."
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserInputError(
            f"{named} is not UTF-8 text (byte {raw[err.start]:#04x} at offset {err.start} cannot be "
            "decoded); convert it to UTF-8 (iconv -t UTF-8) or name another file."
        ) from err


def text_state_of(checkpoint: dict[str, Any], path: str) -> dict[str, Any]:
    """The fitted text state a checkpoint carries (``vocabulary``, ``block_size``), under its DataModule's
    entry, where Lightning puts ``state_dict()``."""
    for value in checkpoint.values():
        if isinstance(value, dict) and isinstance(value.get("vocabulary"), list):
            return value
    raise UserInputError(
        f"checkpoint {path!r} carries no vocabulary (it was not written by a run of TextDataModule); "
        "train a language model first."
    )


def vocabulary_of(checkpoint: dict[str, Any], path: str) -> Vocabulary:
    """The vocabulary fitted in the run that wrote the checkpoint."""
    return Vocabulary(tuple(text_state_of(checkpoint, path)["vocabulary"]))


def windows(ids: torch.Tensor, block_size: int, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N,)`` ids → inputs ``x`` and targets ``y``, both ``(W, block_size)`` int64: window ``w`` reads
    ``ids[w * stride : w * stride + block_size]`` and its targets are the same stretch one character on.

    A tail too short for a whole window is left out.
    """
    spans = ids.unfold(0, block_size + 1, stride)  # (W, block_size + 1) views, no copy
    return spans[:, :-1].contiguous(), spans[:, 1:].contiguous()


class TextDataModule(ResumableDataModule):
    """A character-level text: the last ``test_fraction`` of it for test, the ``val_fraction`` before
    that for validation, the rest for training, each a contiguous stretch (so no window of one split
    shares a character with another's).

    An example is a window of ``block_size`` characters ``x`` and the next character at each position
    ``y``, both ``(block_size,)`` int64 ids. Training windows start every ``stride`` characters (the
    default, ``block_size``, makes them adjacent; a smaller stride overlaps them); validation and test
    windows never overlap, so each of their characters is scored once. The vocabulary (characters seen
    ``min_count`` times in the training stretch, in code-point order from id 1; id 0 for any other
    character, see :class:`Vocabulary`) is saved in every checkpoint, and read from
    ``preprocessing_from`` instead of being fitted again.

    Args:
        path: A UTF-8 text file; left out, Python's bundled help topics (:func:`bundled_text`).
        block_size: Characters per window: the context the model learns to predict from.
        stride: Characters between the starts of consecutive training windows; left out, ``block_size``.
        val_fraction: Share of the text, just before the test stretch, held out for validation.
        test_fraction: Share of the text at its end held out for the final test; touched only by ``test``.
        min_count: Training occurrences a character needs to get an id of its own.
        predict_path: A UTF-8 text file whose non-overlapping windows ``predict`` reads (each predicted
            item is the character that follows a window); left out, the validation stretch.
        preprocessing_from: A checkpoint whose vocabulary to use instead of fitting one; the CLI sets it
            to ``--ckpt_path``.
        seed: Seeds the training shuffle.
        batch_size: Windows per batch, per process.
        num_workers: Loader worker processes; 0 loads in the main process (best for in-memory data).
        drop_last: Drop the last, smaller training batch of each epoch.
        resplit_on_resume: Let a resumed fit go on with another text or other split settings than its
            checkpoint's run split it with (text it held out may then be trained on); left false, such a
            resume is refused.
    """

    def __init__(
        self,
        path: str | None = None,
        block_size: int = 128,
        stride: int | None = None,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        min_count: int = 1,
        predict_path: str | None = None,
        preprocessing_from: str | None = None,
        seed: int = 42,
        batch_size: int = 64,
        num_workers: int = 0,
        drop_last: bool = False,
        resplit_on_resume: bool = False,
    ) -> None:
        super().__init__(seed, batch_size, num_workers, drop_last)
        check_fractions(val_fraction, test_fraction, "text")
        for name, value in {
            "block_size": block_size,
            "min_count": min_count,
        }.items():
            if value < 1:
                raise UserInputError(f"data.{name}={value} must be at least 1.")
        if stride is not None and stride < 1:
            raise UserInputError(f"data.stride={stride} must be at least 1 (or left out: block_size).")
        self.save_hyperparameters()
        self.path = path
        self.block_size = block_size
        self.stride = stride or block_size
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.min_count = min_count
        self.predict_path = predict_path
        self.preprocessing_from = preprocessing_from
        self.resplit_on_resume = resplit_on_resume
        self._datasets: dict[Stage, TensorBatches] = {}

    # -- the text -------------------------------------------------------------------------------------

    @cached_property
    def text(self) -> str:
        """The whole text, read once."""
        return bundled_text() if self.path is None else read_text(self.path)

    @property
    def source(self) -> str:
        """The text's name in sentences: the file, or the bundled help topics."""
        return f"data.path={self.path!r}" if self.path is not None else "the bundled text (pydoc_data)"

    @cached_property
    def stretches(self) -> dict[str, tuple[int, int]]:
        """``(start, end)`` character offsets of each split: train, then val, then test, end to end."""
        n = len(self.text)
        test = round(n * self.test_fraction)
        val = round(n * self.val_fraction)
        bounds = {"train": (0, n - val - test), "val": (n - val - test, n - test), "test": (n - test, n)}
        short = {name: end - start for name, (start, end) in bounds.items() if end - start <= self.block_size}
        if short:
            raise UserInputError(
                f"{self.source} holds {n} characters, too few for data.block_size={self.block_size} with "
                f"val_fraction={self.val_fraction} and test_fraction={self.test_fraction}: the "
                f"{', '.join(f'{k} stretch has {v}' for k, v in short.items())}, and each needs at least "
                f"{self.block_size + 1}; use a longer text, a smaller block_size or other fractions."
            )
        return bounds

    def stretch(self, stage: Literal["train", "val", "test"]) -> str:
        """The text of one split."""
        start, end = self.stretches[stage]
        return self.text[start:end]

    @cached_property
    def split_record(self) -> dict[str, Any]:
        """What the split was made from, saved in every checkpoint for a resumed fit to compare
        (:func:`check_split`): a hash of each line of the text, the split of the stretch it ends in (a
        line that runs across two stretches counts as the later, held-out one's), and the fractions
        that set the stretches. Lines rather than the stretches' ends: text added, removed or edited
        anywhere is named by the lines it touches, an edit that keeps the text's length too."""
        lines = pd.Series(self.text.splitlines(keepends=True), dtype=object)
        # a line by its text and how many equal lines come before it, so that repeated lines (blank
        # ones) are items of their own, each with its own split
        frame = pd.DataFrame({"line": lines, "repeat": lines.groupby(lines).cumcount()})
        last = np.cumsum(lines.str.len().to_numpy()) - 1  # (L,) offset of each line's last character
        ends = [self.stretches["train"][1], self.stretches["val"][1]]
        splits = np.array([TRAINED, VALIDATED, TESTED])[np.searchsorted(ends, last, side="right")]
        # block_size and stride cut each stretch into windows but move no character into another
        settings = {"data.val_fraction": self.val_fraction, "data.test_fraction": self.test_fraction}
        return split_record(pd.util.hash_pandas_object(frame, index=False).to_numpy(), splits, settings)

    # -- what is fitted on the training stretch -------------------------------------------------------

    @cached_property
    def vocabulary(self) -> Vocabulary:
        """The fitted vocabulary: ``preprocessing_from``'s checkpoint's, or fitted on the training stretch."""
        if self.preprocessing_from is not None:
            return vocabulary_of(load_checkpoint(self.preprocessing_from), self.preprocessing_from)
        return Vocabulary.fit(self.stretch("train"), self.min_count)

    @property
    def in_features(self) -> int:
        """Vocabulary size, ids the net embeds. Reading it reads the text and fits the vocabulary, so bad
        data fails before a run starts."""
        return len(self.vocabulary)

    @property
    def out_features(self) -> int:
        """Vocabulary size, the width of the net's head: one logit per possible next character."""
        return len(self.vocabulary)

    @property
    def label_names(self) -> list[str]:
        """What each class id stands for: ``UNKNOWN_TEXT``, then the known characters."""
        return self.vocabulary.labels

    def encode(self, text: str) -> torch.Tensor:
        """``text`` → ``(len(text),)`` int64 ids of this vocabulary."""
        return self.vocabulary.encode(text)

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        """Ids of this vocabulary → text."""
        return self.vocabulary.decode(ids)

    def unigram_perplexity(self, stage: Literal["train", "val", "test"] = "val") -> float:
        """The baseline to beat: the perplexity on a split's targets (the very characters the model is
        scored on) of character frequencies counted on the training targets, add-one smoothed."""
        counts = torch.bincount(self.dataset("train").tensors[1].flatten(), minlength=len(self.vocabulary))
        log_p = torch.log((counts + 1.0) / (counts.sum() + len(counts)))  # (V,), in nats
        targets = self.dataset(stage).tensors[1].flatten()
        return float(torch.exp(-log_p[targets].mean()))

    @override
    def setup(self, stage: str) -> None:
        """Before a fit: says the baseline the model must beat, on the validation stretch it is scored on."""
        if stage == "fit":
            perplexity = self.unigram_perplexity("val")
            notice(
                f"Unigram baseline on {self.source} (each character's frequency in the training stretch, "
                f"no context): val/loss {math.log(perplexity):.3f} nats, val/perplexity {perplexity:.1f}; a "
                "model that reads the context ends below it."
            )

    # -- tensors --------------------------------------------------------------------------------------

    def dataset(self, stage: Stage) -> TensorBatches:
        """The windows of one split (built once): ``(x, y)``, or ``(x,)`` for ``predict``."""
        if stage not in self._datasets:
            if stage == "predict":
                text = self.stretch("val") if self.predict_path is None else self.predict_text
                x, _ = windows(self.encode(text), self.block_size, self.block_size)
                self._datasets[stage] = TensorBatches(x)
            else:
                stride = self.stride if stage == "train" else self.block_size
                self._datasets[stage] = TensorBatches(
                    *windows(self.encode(self.stretch(stage)), self.block_size, stride)
                )
        return self._datasets[stage]

    @cached_property
    def predict_text(self) -> str:
        """``predict_path``'s text; it must hold at least one window and the character after it."""
        assert self.predict_path is not None
        text = read_text(self.predict_path, "data.predict_path")
        if len(text) <= self.block_size:
            raise UserInputError(
                f"data.predict_path={self.predict_path!r} holds {len(text)} characters; a window needs "
                f"data.block_size={self.block_size} and the one after it."
            )
        return text

    def predict_index(self) -> pd.Index:
        """Where each predicted window starts: its character offset in the predicted file (or the whole
        text, for the validation stretch). The prediction is the character right after the window."""
        start = self.stretches["val"][0] if self.predict_path is None else 0
        count = len(self.dataset("predict"))
        return pd.Index(start + self.block_size * np.arange(count), name="offset")

    # -- checkpoints ----------------------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        """Saved in every checkpoint (Lightning calls it): the vocabulary and the window length, as plain
        data, what the split was made from, and the training shuffle's generator, so that a resumed run
        draws the same orders."""
        return {
            "vocabulary": list(self.vocabulary.characters),
            "block_size": self.block_size,
            "split": self.split_record,
            **super().state_dict(),
        }

    @override
    def check_resume(self, state_dict: dict[str, Any]) -> None:
        """A resumed fit goes on with its run's split (:func:`check_split`)."""
        check_split(
            state_dict.get("split"), self.split_record, self.resplit_on_resume, "line",
            "data.resplit_on_resume",
        )  # fmt: skip

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A resumed fit goes on with its run's split (:meth:`check_resume`, first); a checkpoint's
        vocabulary wins over one fitted anew (say, for an evaluation on a text that changed since)."""
        super().load_state_dict(state_dict)
        restored = Vocabulary(tuple(state_dict["vocabulary"]))
        if restored != self.vocabulary:
            self.__dict__["vocabulary"] = restored
            self._datasets.clear()
