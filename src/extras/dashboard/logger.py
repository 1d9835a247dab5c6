"""Lightning's TensorBoard logger, writing each stage's values as a run of its own, as Keras does.

TensorBoard colours lines by run, and draws one chart per tag: ``train/loss`` and ``val/loss`` written into
one run are two charts of one colour. Written as the tag ``metrics/loss`` of two runs, ``<version>/train``
and ``<version>/validation``, they are one chart with two colours and a legend, the convention of Keras'
TensorBoard callback. What the run folder then holds:

- ``<version>/`` itself: the run's config and environment (Text tab), its HParams session and the best
  epoch's values and figures (``summary/…``), and whatever is written straight to ``experiment``;
- ``<version>/train``, ``<version>/validation``, ``<version>/test``: the values logged under ``train/``,
  ``val/`` and ``test/``, each under the rest of its name (``val/loss`` → ``metrics/loss``, a name without
  a group of its own going into the ``metrics`` group; ``train/optimization/lr`` → ``optimization/lr``).

Names without one of those stages (``epoch_loss``, ``my/value``) go to ``<version>/`` as they are.
"""

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import loggers
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.tensorboard import SummaryWriter
from typing_extensions import override

#: the run, inside the version folder, that each stage's values are written to
STAGE_RUNS = {"train": "train", "val": "validation", "test": "test"}
#: the Time Series group of a value whose name has no group of its own: the first one TensorBoard opens
GROUP = "metrics"


def run_and_tag(name: str) -> tuple[str, str]:
    """Where a logged value goes: ``("validation", "metrics/loss")`` for ``val/loss``; ``("", name)`` (the
    version folder itself) for a name without a stage."""
    stage, _, rest = name.partition("/")
    if stage not in STAGE_RUNS or not rest:
        return "", name
    return STAGE_RUNS[stage], rest if "/" in rest else f"{GROUP}/{rest}"


def logged_name(run: str, tag: str) -> str:
    """The name a value was logged under, from its run and tag: the inverse of :func:`run_and_tag`."""
    stage = next((s for s, r in STAGE_RUNS.items() if r == run), None)
    if stage is None:
        return tag
    return f"{stage}/{tag.removeprefix(GROUP + '/')}"


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a run folder and its stage runs, by the name it was logged under: ``(step, value)``
    pairs, as TensorBoard reads them (``{"val/loss": [(19, 0.41), ...], "train/optimization/lr": ...}``)."""
    # imported here: reading events back (a sweep's summary, the tests) is rare; writing is every run's
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, list[tuple[int, float]]] = {}
    for run in ["", *STAGE_RUNS.values()]:
        folder = Path(log_dir) / run
        if not folder.is_dir():
            continue
        events = EventAccumulator(str(folder), size_guidance={"scalars": 0}).Reload()
        for tag in events.Tags()["scalars"]:
            found[logged_name(run, tag)] = [(e.step, e.value) for e in events.Scalars(tag)]
    return found


class TensorBoardLogger(loggers.TensorBoardLogger):
    """``lightning.pytorch.loggers.TensorBoardLogger`` with a run per stage, whose ``save()`` does its work
    at most once a second.

    ``log_metrics`` writes ``<stage>/<name>`` values into the stage's run (:data:`STAGE_RUNS`, see the module
    docstring); ``experiment`` is the version folder's own writer, as Lightning's is.

    Lightning calls ``save()`` after every ``log_metrics``: each call flushes the event files and asks the
    filesystem (through fsspec) whether ``hparams.yaml`` exists. Here a call
    within ``save_every_s`` seconds of the last one that ran is skipped, so a value may wait in its event
    file's buffer until a later save (at the latest the writer's own flush every ``flush_secs``) before a
    live TensorBoard shows it; the run's end (``finalize``) flushes and saves as Lightning's does.

    Args:
        save_every_s: Seconds between two saves that run; 0 saves on every call, as Lightning's does.
        **kwargs: ``TensorBoardLogger``'s (``save_dir``, ``name``, ``version``, ``default_hp_metric`` ...).
    """

    def __init__(self, *args: object, save_every_s: float = 1.0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.save_every_s = save_every_s
        self._saved_at: float | None = None
        self._runs: dict[str, SummaryWriter] = {}

    def run_writer(self, run: str) -> SummaryWriter:
        """The writer of one of the version folder's runs (``"train"``, ``"validation"``, ``"test"``);
        ``""``: the folder's own, ``experiment``."""
        if not run:
            return self.experiment
        if run not in self._runs:
            self._runs[run] = SummaryWriter(str(Path(self.log_dir) / run))
        return self._runs[run]

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        for name, value in metrics.items():
            if name == "epoch":  # Lightning's epoch counter: the x axis says it already
                continue
            run, tag = run_and_tag(name)
            number = value.item() if isinstance(value, torch.Tensor) else float(value)
            self.run_writer(run).add_scalar(tag, number, step)

    @override
    @rank_zero_only
    def save(self) -> None:
        now = time.monotonic()
        if self._saved_at is not None and now - self._saved_at < self.save_every_s:
            return
        self._saved_at = now
        for writer in self._runs.values():
            writer.flush()
        super().save()

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        self._saved_at = None  # the last save always runs
        super().finalize(status)
        for writer in self._runs.values():
            writer.close()
        # a test after the fit, in the same process, opens them again
        self._runs = {}
