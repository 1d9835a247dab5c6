"""What the shipped DataModules share: tensors batched by indexing, and loaders that resume mid-epoch."""

import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Sized
from typing import Any, Literal, cast

import lightning as L
import numpy as np
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

from src.errors import UserInputError, notice

Stage = Literal["train", "val", "test", "predict"]


class TensorBatches(Dataset[tuple[torch.Tensor, ...]]):
    """Tensors in memory, batched by indexing: ``__getitems__`` takes a whole batch's indices at once."""

    def __init__(self, *tensors: torch.Tensor, repeat: int = 1) -> None:
        if len({len(t) for t in tensors}) != 1:
            raise ValueError("all tensors need the same first dimension")
        self.tensors = tensors
        #: how many times each row is in the dataset: index ``i`` is row ``i % rows``
        self.repeat = repeat

    def __len__(self) -> int:
        return len(self.tensors[0]) * self.repeat

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        index %= len(self.tensors[0])
        return tuple(t[index] for t in self.tensors)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(indices)
        if self.repeat > 1:
            index = index % len(self.tensors[0])
        return tuple(t.index_select(0, index) for t in self.tensors)  # t[index], but faster


def keep_batch(batch: Any) -> Any:
    """The collate function for :class:`TensorBatches`: the batch is already stacked."""
    return batch


class ResumableLoader(DataLoader):
    """The training loader, resumable mid-epoch: its state is the generator before this epoch's order was
    drawn, the batches processed (not drawn: Lightning draws one ahead) and the :meth:`batching`; a resume
    draws the same order and skips those batches, or is refused under other batching.

    Args:
        *args: What ``DataLoader`` takes.
        **kwargs: What ``DataLoader`` takes.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: batches of the current epoch that reached a training step; the DataModule counts them
        self.processed = 0
        #: processes that share each epoch (the DataModule sets the Trainer's world size)
        self.processes = 1
        #: the Trainer that iterates it, once a batch reached a step (the DataModule sets it)
        self.trainer: L.Trainer | None = None
        self._epoch_start: torch.Tensor | None = None
        self._skip = 0
        self._closing = False  # the epoch to skip had all of its batches done

    def batching(self) -> dict[str, Any]:
        """What cuts an epoch into batches: batch size, drop_last, processes, items and passes over them."""
        passes = self.dataset.repeat if isinstance(self.dataset, TensorBatches) else 1
        return {
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "processes": self.processes,
            "items": len(cast(Sized, self.dataset)) // passes,
            "passes": passes,
        }

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # typed as any iterator: StreamLoader's
        closing = self._closing
        skip = self.start_epoch()
        batches = super().__iter__()
        if closing:
            # all batches done (resumed within the closing validation): drawn, so the generator ends where
            # the interrupted epoch's did, but none given (other epochs skip once the sampler's epoch is set)
            deque(batches, maxlen=0)
            return batches
        return itertools.islice(batches, skip, None)

    def start_epoch(self) -> int:
        """Set the generator for this epoch's order (on resume, the interrupted one's); return the skip."""
        skip, self._skip, self._closing = self._skip, 0, False
        if self.generator is not None:
            if skip and self._epoch_start is not None:
                self.generator.set_state(self._epoch_start)  # the interrupted epoch's order, again
            else:
                self._epoch_start = self.generator.get_state()
        self.processed = skip
        return skip

    def position(self) -> int:
        """The batches a resume skips: those processed while the epoch (or its closing validation) lasts."""
        trainer = self.trainer
        batches = trainer.num_training_batches if trainer is not None else len(self)
        if self.processed < batches or self.closing():
            return self.processed
        return 0

    def closing(self) -> bool:
        """Whether the epoch's batches are all done and its closing validation is under way."""
        trainer = self.trainer
        return trainer is not None and trainer.validating and self.processed >= trainer.num_training_batches

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch_start": self._epoch_start,
            "done": self.position(),
            "batching": self.batching(),
            "closing": self.closing(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The interrupted epoch's position; refused here if batching differs (a done epoch draws nothing)."""
        done = int(state_dict["done"])
        if done:  # "batching" and "closing" are absent from checkpoints of older versions
            check_batching(
                state_dict.get("batching"), self.batching(), done, len(self), state_dict.get("closing", False)
            )
        self._epoch_start = state_dict["epoch_start"]
        self._skip = done
        self._closing = bool(done and state_dict.get("closing", False))


def check_batching(
    saved: dict[str, Any] | None, now: dict[str, Any], done: int, batches: int | None, closing: bool = False
) -> None:
    """Refuse to go on with an epoch interrupted after ``done`` batches under batching other than ``saved``
    (``None``: not recorded); all ``batches`` done is a position only in the ``closing`` validation."""
    differs = [key for key in now if saved is not None and saved.get(key) != now[key]]
    if "batch_size" in differs and "passes" in differs:
        differs.remove("passes")  # data.min_batches_per_epoch gives small batches fewer passes
    changes = [_change(key, cast(dict, saved)[key], now[key]) for key in differs]
    if not changes and (batches is None or done < batches or (done == batches and closing)):
        return
    if not changes:
        changes = [(f"{done} batches done of an epoch that now has {batches}", "with its batching")]
    raise UserInputError(
        "this checkpoint stopped in the middle of an epoch, whose remaining batches cannot go on exactly "
        f"under other batching ({'; '.join(what for what, _ in changes)}); resume "
        f"{', '.join(fix for _, fix in changes)}, or resume from a checkpoint written at an epoch's end to "
        "change it."
    )


def _change(key: str, saved: Any, now: Any) -> tuple[str, str]:
    """What changed in one part of the batching, and how a resume puts it back."""
    if key == "processes":
        return (
            f"{now} process{'es' * (now != 1)} where the interrupted run had {saved}",
            f"on {saved} process{'es' * (saved != 1)} (trainer.devices x trainer.num_nodes)",
        )
    if key == "items":
        return (
            f"a training split of {now} items where the interrupted run had {saved}",
            "on the data the interrupted run trained on",
        )
    if key == "passes":
        return (
            f"{now} pass{'es' * (now != 1)} over the training items an epoch where the interrupted run had "
            f"{saved}",
            "with the interrupted run's data.min_batches_per_epoch",
        )
    setting = f"data.{key}={{}}"
    shown = (lambda v: str(v).lower()) if isinstance(saved, bool) else str
    return (
        f"{setting.format(shown(now))} where the interrupted run had {shown(saved)}",
        f"with {setting.format(shown(saved))}",
    )


#: the split of each item in :func:`split_record`
TRAINED, VALIDATED, TESTED = 0, 1, 2


def split_record(items: np.ndarray, splits: np.ndarray, settings: dict[str, Any]) -> dict[str, Any]:
    """What a split was made from, as tensors and plain data: ``items``, a 64-bit hash of each item;
    ``splits``, each one's split (:data:`TRAINED` ...) or ``(items, 3)`` row counts per split (a row group);
    the ``settings`` that split them, by their config keys."""
    counts = np.ndim(splits) == 2
    return {
        "items": torch.from_numpy(np.array(items, np.uint64).view(np.int64)),  # a copy: pandas' is read-only
        "splits": torch.from_numpy(np.array(splits, np.int64 if counts else np.uint8)),
        "settings": dict(settings),
    }


def check_split(
    saved: dict[str, Any] | None,
    now: dict[str, Any],
    resplit: bool,
    item: str,
    option: str,
    part: str | None = None,
    moved: Callable[[], tuple[int, int]] | None = None,
) -> None:
    """Refuse a resumed fit whose data or split settings differ from its checkpoint's (``saved``, ``now``:
    :func:`split_record`'s), unless ``resplit`` (the ``option``); then say how many items changed split.
    Where a record's item holds many ``item``s (``part``), ``moved`` counts those that changed split and
    those newly trained on."""
    if saved is None:
        return
    old, new = saved["items"].numpy(), now["items"].numpy()
    changes = _item_changes(old, new, part or item) + [
        f"{key}={_shown(value)} where it had {_shown(saved['settings'][key])}"
        for key, value in now["settings"].items()
        if key in saved["settings"] and saved["settings"][key] != value
    ]
    was, is_now = saved["splits"].numpy(), now["splits"].numpy()
    if not changes and np.array_equal(was, is_now):
        return
    said = "; ".join(changes or [f"the same {part or item}s, split otherwise"])
    if not resplit:
        raise UserInputError(
            f"the checkpoint's run split other {item}s into training, validation and test ({said}), and a "
            f"resumed fit goes on with that split only, so that {item}s it held out are never trained on; "
            f"start a new run (leave out --ckpt_path), or pass --{option}=true to go on with the new split."
        )
    changed, into_training = moved() if moved is not None else _moved(saved, now)
    notice(
        f"{option}: the fit goes on with a new split ({said}): {_count(changed, item)} changed split, "
        f"{into_training} of them held out before and trained on now."
    )


def _moved(saved: dict[str, Any], now: dict[str, Any]) -> tuple[int, int]:
    """Of the items both records hold: those whose split changed, and those of them newly trained on."""
    old, new = saved["items"].numpy(), now["items"].numpy()
    keys, first = np.unique(old, return_index=True)
    at = np.searchsorted(keys, new).clip(max=len(keys) - 1)
    before, is_now = saved["splits"].numpy()[first[at]], now["splits"].numpy()
    moved = (keys[at] == new) & (before != is_now)
    into_training = moved & (before != TRAINED) & (is_now == TRAINED)
    return int(moved.sum()), int(into_training.sum())


def _item_changes(old: np.ndarray, new: np.ndarray, item: str) -> list[str]:
    """How the hashed items ``new`` differ from ``old``: added, removed, edited, or reordered."""
    if np.array_equal(old, new):
        return []
    keys, index = np.unique(np.concatenate([old, new]), return_inverse=True)
    balance = np.bincount(index[len(old) :], minlength=len(keys)) - np.bincount(
        index[: len(old)], minlength=len(keys)
    )
    fresh, gone = int(balance[balance > 0].sum()), int(-balance[balance < 0].sum())
    edited = min(fresh, gone)
    counts = {"added": fresh - edited, "removed": gone - edited, "edited": edited}
    said = [f"{_count(n, item)} {how}" for how, n in counts.items() if n]
    return said or [f"the same {item}s in another order"]


def _count(n: int, item: str) -> str:
    return f"{n} {item}{'s' * (n != 1)}"


def _shown(value: Any) -> str:
    """A setting as YAML writes it (``null``, ``true``)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def check_fractions(val_fraction: float, test_fraction: float, items: str, key: str = "data") -> None:
    """The validation and test shares of the data must leave ``items`` (rows, images, text) to train on."""
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise UserInputError(
            f"{key}.val_fraction={val_fraction} and {key}.test_fraction={test_fraction} do not fit: each "
            f"must lie in (0, 1) and together they must stay below 1, leaving {items} to train on."
        )


class ResumableDataModule(L.LightningDataModule, ABC):
    """The loaders of the splits, with a training loader that resumes mid-epoch bit for bit; a subclass
    says what each split holds (:meth:`dataset`).

    The loader's position is also in this DataModule's ``state_dict``: a run-length scheduler builds the
    loader early, and Lightning 2.6 then never hands that loader its saved state.

    Args:
        seed: Seeds the training order.
        batch_size: Items per batch, per process.
        num_workers: Loader worker processes; 0 loads in the main process.
        drop_last: Drop the last, smaller training batch of each epoch.
    """

    def __init__(self, seed: int, batch_size: int, num_workers: int, drop_last: bool) -> None:
        super().__init__()
        if batch_size < 1:
            raise UserInputError(f"data.batch_size={batch_size} must be at least 1.")
        if num_workers < 0:
            raise UserInputError(f"data.num_workers={num_workers} must be 0 (load in this process) or more.")
        self._loading = (batch_size, num_workers, drop_last)
        self._shuffle = torch.Generator().manual_seed(seed)
        self._train_loader: ResumableLoader | None = None
        self._loader_state: dict[str, Any] | None = None  # restored, waiting for the loader
        #: the checkpoint the fit resumes from was checked already (:meth:`check_resume`, by the CLI)
        self.resume_checked = False

    @abstractmethod
    def dataset(self, stage: Stage) -> Dataset[Any]:
        """The items of one split (``train``, ``val``, ``test``) or of what ``predict`` reads."""

    def _loader_options(self) -> dict[str, Any]:
        batch_size, workers, _ = self._loading
        on_cuda = self.trainer is not None and isinstance(self.trainer.accelerator, CUDAAccelerator)
        return {
            "batch_size": batch_size,
            "collate_fn": keep_batch,  # the datasets hand over whole batches
            "num_workers": workers,
            "persistent_workers": workers > 0,
            "pin_memory": on_cuda,
        }

    def batching(self, processes: int) -> dict[str, Any]:
        """The training loader's :meth:`ResumableLoader.batching` on ``processes``, known before the fit."""
        return self._training_loader(processes).batching()

    def _training_loader(self, processes: int) -> ResumableLoader:
        loader = ResumableLoader(
            self.dataset("train"),
            shuffle=True,
            generator=self._shuffle,
            drop_last=self._loading[2],
            **self._loader_options(),
        )
        loader.processes = processes  # kept by the copy with a DistributedSampler Lightning makes
        return loader

    @override
    def train_dataloader(self) -> DataLoader:
        """Shuffled by this DataModule's generator, at its restored position."""
        loader = self._training_loader(self.trainer.world_size if self.trainer is not None else 1)
        if self._loader_state is not None:
            loader.load_state_dict(self._loader_state)
            self._loader_state = None
        self._train_loader = loader
        return loader

    @override
    def state_dict(self) -> dict[str, Any]:
        """The training order's generator and, in the middle of an epoch, the loader's position."""
        loader = self._train_loader
        position = loader.state_dict() if loader is not None and loader.position() else None
        return {"shuffle": self._shuffle.get_state(), "loader": position}

    def check_resume(self, state_dict: dict[str, Any]) -> None:
        """Refuse to resume from ``state_dict`` on data it cannot go on with exactly; nothing by default."""

    def check_resumed_batching(self, state_dict: dict[str, Any], processes: int) -> None:
        """Refuse to go on with an interrupted epoch under other batching (:func:`check_batching`)."""
        position = state_dict.get("loader")
        if position and position["done"]:
            batching = self.batching(processes)
            check_batching(
                position.get("batching"), batching, position["done"], None, position.get("closing", False)
            )

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The training order's state; in a resumed fit, first :meth:`check_resume` unless the CLI did."""
        fitting = self.trainer is not None and self.trainer.state.fn == TrainerFn.FITTING
        if fitting and not self.resume_checked:
            self.check_resume(state_dict)
        self.resume_checked = False
        if "shuffle" in state_dict:
            self._shuffle.set_state(state_dict["shuffle"])
        self._loader_state = state_dict.get("loader")

    @override
    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.dataset("val"), **self._loader_options())

    @override
    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.dataset("test"), **self._loader_options())

    @override
    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.dataset("predict"), **self._loader_options())

    @override
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # called once per batch a step runs on (not per batch drawn): counts the epoch's batches processed;
        # a LightningModule's own on_before_batch_transfer yields to this one, as Lightning warns
        if self.trainer is not None and self.trainer.training:
            running = self.trainer.train_dataloader
            if isinstance(running, ResumableLoader):
                # under DDP, Lightning's copy with a DistributedSampler: the one iterated and saved
                self._train_loader = running
            if self._train_loader is not None:
                self._train_loader.trainer = self.trainer
                self._train_loader.processed += 1
        return batch
