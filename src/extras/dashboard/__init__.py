"""What TensorBoard shows beside the losses and metrics the task logs itself.

The module logs ``train/…``, ``val/…`` and ``test/…`` values, :class:`~src.extras.dashboard.steps.StepValues`
(run by the dashboard) the per-step ones; with the dashboard's logger (:mod:`src.extras.dashboard.logger`)
each stage is a run of its own, so train and validation share a chart in two colours. The dashboard adds
per epoch the throughput, the epoch time and the share of it spent waiting for data (``<stage>/speed/…``)
and the generalization gap; once per run a custom-scalars layout and the HParams session: a few
hyperparameters people compare (learning rate, batch size, net and its size, epochs, seed, data), and at
the fit's end the best epoch's validation values (``summary/best_<name>``), which the HParams table shows
first, then the test values. The whole resolved config is the Text tab's (written by the CLI). Histograms
and the model graph are optional.

It reads only public state: ``trainer.callback_metrics``, the Trainer's optimizers, schedulers and checkpoint
callback, the module's parameters and the DataModule's hyperparameters. The gap needs ``train/loss`` and
``val/loss`` logged per epoch.

Every per-step hook here is host bookkeeping (a clock read, an integer add). Values reach the logger once per
epoch, so the dashboard adds no device sync per step."""

import importlib.metadata
import math
import os
import platform
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.data import extract_batch_size
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.writer import FileWriter
from typing_extensions import override

from src.errors import UserInputError
from src.extras.dashboard.logger import GROUP
from src.extras.dashboard.steps import StepValues
from src.extras.loggers import logging_step, monitored, tensorboard_writer, write

ROOT = Path(__file__).resolve().parents[3]  # src/extras/<extra>/__init__.py: the repository
PACKAGES = ("torch", "lightning", "torchmetrics", "tensorboard", "numpy", "scikit-learn", "jsonargparse")

HParams = dict[str, bool | int | float | str]
#: the hyperparameters shown first in the HParams table (TensorBoard shows five at first; the others are a
#: click away, and the whole config is in the Text tab)
HEADLINE = ("lr", "batch_size", "net", "net_params", "epochs")
#: the hyperparameters' names in the table
DISPLAY = {
    "lr": "learning rate",
    "batch_size": "batch size",
    "net": "net",
    "net_params": "net parameters",
    "epochs": "max epochs",
    "seed": "seed",
    "data": "data",
    "model": "LightningModule",
    "optimizer": "optimizer",
    "weight_decay": "weight decay",
    "scheduler": "scheduler",
    "precision": "precision",
    "clip": "gradient clipping",
    "accumulate": "accumulated batches",
}
#: DataModule hyperparameters that name the data, the first one present wins
DATA_KEYS = ("path", "folder", "csv", "source")
#: the run folder's group holding what the fit ends with: the best epoch's values and figures
SUMMARY = "summary"


class Dashboard(Callback):
    """Speed, generalization gap, HParams and layout; histograms and graph on request.

    Args:
        histogram_every_n_epochs: Write weight and gradient histograms (``weights/<param>`` and
            ``weights/<param>/grad``) at the first optimizer step of every n-th epoch; 0 turns them off.
        log_graph: Trace the net (``pl_module.net`` when the module has one, else the whole module) once
            on the first training batch and write its graph (Graphs tab).
        hparams: Further hyperparameters, name to value, shown first in the HParams table beside those
            read from the run (a sweep gives each trial's searched values).
        step_values: Also write the loss, learning rate, gradient norm and clipped share every
            ``log_every_n_steps`` (:class:`~src.extras.dashboard.steps.StepValues`, run by this callback:
            one callback on the Trainer for both).
    """

    def __init__(
        self,
        histogram_every_n_epochs: int = 0,
        log_graph: bool = False,
        hparams: HParams | None = None,
        step_values: bool = True,
    ) -> None:
        if histogram_every_n_epochs < 0:
            raise UserInputError(
                f"Dashboard histogram_every_n_epochs={histogram_every_n_epochs} must be 0 (off) or a "
                "positive number of epochs."
            )
        self.histogram_every_n_epochs = histogram_every_n_epochs
        self.log_graph = log_graph
        #: further hyperparameters shown first in the HParams table (a sweep's searched values)
        self.hparams: HParams = dict(hparams or {})
        #: the per-step values' writer, when on
        self.steps = StepValues() if step_values else None
        self._sessions: set[str] = set()  # the run folders whose HParams session is written
        self._validations: list[tuple[int, int, dict[str, float]]] = []  # (epoch, step, values) per fit
        self._graph_written = False
        self._histogram_epoch = -1
        # host clock bookkeeping of the current epoch, in seconds
        self._epoch_start = self._mark = self._val_start = 0.0
        self._data_time = self._step_time = 0.0
        self._samples = 0
        self._layout_written = False
        self._validated_epoch = -1  # the epoch of the last validation of the fit
        self._ended: tuple[int, int] | None = None  # (epoch, step) of the last training epoch ended

    # -- once per run ---------------------------------------------------------------------------------

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # a fit writes its session once the optimizer exists (on_fit_start): its learning rate is known
        if stage not in ("fit", "predict"):
            self._start_session(trainer, pl_module)
        self._layout_written = stage != "fit"

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.steps is not None:
            self.steps.on_fit_start(trainer, pl_module)
        self._validations = []
        self._start_session(trainer, pl_module)

    def _start_session(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The HParams session, in the run folder itself (TensorBoard's convention): its stage runs
        (``train``, ``validation``, ``test``) are its metrics' groups."""
        writer = tensorboard_writer(trainer)
        # the writer's own folder, not trainer.log_dir: that one is a collective under DDP, and only
        # rank 0 gets here
        if writer is None or writer.log_dir in self._sessions:
            return
        # fit followed by test in one process shares the run: it is written once
        self._sessions.add(writer.log_dir)
        hparams = self.hparams | run_hparams(trainer, pl_module)
        _add_summary(writer, hparams_summary.hparams_pb(hparams, trial_id=run_name(trainer, writer)))
        # the Text tab: what the run ran on, beside the config the run folder's config.yaml holds
        writer.add_text("run/environment", environment_text(trainer))
        writer.flush()

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write_gap(trainer)
        self._write_best(trainer, pl_module)
        self._end_session(trainer, api_pb2.STATUS_SUCCESS)

    @override
    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end_session(trainer, api_pb2.STATUS_SUCCESS)

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._end_session(trainer, api_pb2.STATUS_FAILURE)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._sessions = {s for s in self._sessions if stage == "fit"}  # a test after the fit shares it

    def _end_session(self, trainer: L.Trainer, status: int) -> None:
        """The HParams table's status column: success, or failure when the run raised."""
        writer = tensorboard_writer(trainer)
        if writer is not None and writer.log_dir in self._sessions:
            _add_summary(writer, _session_end_pb(status))
            writer.flush()

    def _write_best(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """At the fit's best validation epoch (by the monitored value): that epoch's validation values as
        ``summary/best_<name>`` and its number as ``summary/best_epoch``, in the run folder; and the
        HParams columns, best values first, then the test values of the run's ``test`` stage."""
        writer = tensorboard_writer(trainer)
        monitor, mode = monitored(trainer)
        scored = [v for v in self._validations if math.isfinite(v[2].get(monitor, math.nan))]
        if writer is None or not scored:
            return
        epoch, step, values = (min if mode == "min" else max)(scored, key=lambda v: v[2][monitor])
        names = [name[4:] for name in values if name.startswith("val/") and "/" not in name[4:]]
        for name in names:
            writer.add_scalar(f"{SUMMARY}/best_{name}", values[f"val/{name}"], step)
        writer.add_scalar(f"{SUMMARY}/best_epoch", epoch, step)
        _add_summary(writer, experiment_pb(trainer, pl_module, names, monitor, self.hparams))
        writer.flush()

    # -- speed and the generalization gap, per epoch --------------------------------------------------

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.steps is not None:
            self.steps.on_train_epoch_start(trainer, pl_module)
        self._write_gap(trainer)
        self._epoch_start = self._mark = time.perf_counter()
        self._data_time = self._step_time = 0.0
        self._samples = 0

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.steps is not None:
            self.steps.on_train_batch_start(trainer, pl_module, batch, batch_idx)
        now = time.perf_counter()
        # since the last step ended: fetching the batch and moving it to the device
        self._data_time += now - self._mark
        self._mark = now
        if self.log_graph and not self._graph_written:
            self._write_graph(trainer, pl_module, batch)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.steps is not None:
            self.steps.on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if batch_idx + 1 == trainer.num_training_batches:
            _synchronize(trainer)  # once per epoch: the queued device work belongs to this epoch
        now = time.perf_counter()
        self._step_time += now - self._mark
        self._mark = now
        # read from the shape, no device sync; the task's (x, y) batches directly, others through
        # Lightning's walk over the batch's structure
        first = batch[0] if isinstance(batch, tuple | list) and batch else None
        self._samples += len(first) if isinstance(first, torch.Tensor) else extract_batch_size(batch)

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _synchronize(trainer)
        self._val_start = time.perf_counter()

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        _synchronize(trainer)
        write(trainer, {"val/speed/epoch_time": time.perf_counter() - self._val_start}, logging_step(trainer))

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.steps is not None:
            self.steps.on_train_epoch_end(trainer, pl_module)
        _synchronize(trainer)
        train_time = self._data_time + self._step_time
        # written to the loggers as they are (this process's times: the processes keep step with each
        # other), not through self.log, which nothing monitors them by
        values = {"train/speed/epoch_time": time.perf_counter() - self._epoch_start}
        if train_time > 0:
            # every process runs the same number of equally sized batches
            values["train/speed/samples_per_sec"] = self._samples * trainer.world_size / train_time
            values["train/speed/data_time_share"] = self._data_time / train_time
        write(trainer, values, logging_step(trainer))
        # the step Lightning gives this epoch's values (the index of its last optimizer step)
        self._ended = (trainer.current_epoch, logging_step(trainer))

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._validated_epoch = trainer.current_epoch
        if trainer.is_global_zero:  # the HParams metrics: this validation's values (a read per value)
            logged = trainer.callback_metrics.items()
            values = {n: float(v.item()) for n, v in logged if isinstance(v, torch.Tensor) and v.numel() == 1}
            self._validations.append((trainer.current_epoch, logging_step(trainer), values))
        # the first validation of a fit has logged the metric names the layout charts
        writer = tensorboard_writer(trainer)
        if not self._layout_written and writer is not None:
            self._layout_written = True
            writer.add_custom_scalars(scalars_layout(trainer.callback_metrics))
            writer.flush()

    def _write_gap(self, trainer: L.Trainer) -> None:
        """The gap between the last ended epoch's val/loss and train/loss. A module logs its train loss in
        its own on_train_epoch_end, which Lightning calls after the callbacks', so both are in
        callback_metrics only from the next hook on (the next epoch's start, or the fit's end): written
        then, at the ended epoch's step, and only when that epoch was validated."""
        ended, self._ended = self._ended, None
        if ended is None or ended[0] != self._validated_epoch:
            return
        logged = trainer.callback_metrics
        if "train/loss" in logged and "val/loss" in logged:
            epoch, step = ended
            write(trainer, {"val/generalization_gap": logged["val/loss"] - logged["train/loss"]}, step, epoch)

    # -- optional: histograms and graph ---------------------------------------------------------------

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self.steps is not None:
            self.steps.on_before_optimizer_step(trainer, pl_module, optimizer)
        every, epoch = self.histogram_every_n_epochs, trainer.current_epoch
        if not every or epoch % every or epoch == self._histogram_epoch:
            return
        writer = tensorboard_writer(trainer)
        if writer is None:
            return
        self._histogram_epoch = epoch
        # gradients here are unscaled and not yet clipped; the step about to be taken is the
        # global_step-th (from 0), the one Lightning gives this step's scalars
        step = trainer.global_step
        for name, param in pl_module.named_parameters():
            writer.add_histogram(f"weights/{name}", param.detach(), step)
            if param.grad is not None:
                writer.add_histogram(f"weights/{name}/grad", param.grad, step)

    def _write_graph(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> None:
        self._graph_written = True
        writer = tensorboard_writer(trainer)
        if writer is None:
            return
        # the plain net of a task: tracing the task would walk into its metric modules too
        inner = getattr(pl_module, "net", None)
        net = inner if isinstance(inner, torch.nn.Module) else pl_module
        # traced in eval mode on one row: BatchNorm must not update its statistics from the trace
        modes = {module: module.training for module in net.modules()}
        net.eval()
        try:
            with torch.no_grad():
                writer.add_graph(net, batch[0][:1])
        finally:
            for module, training in modes.items():
                module.training = training


def scalars_layout(logged: Mapping[str, Any]) -> dict[str, dict[str, list[Any]]]:
    """The custom-scalars layout, over the run's stage runs (tags are regexes, matched in every run, each
    run a colour): each validation value on one chart with its train curve and the values named after it
    (a baseline's ``val/acc_hgb`` beside ``val/acc``); ``logged`` holds what the module logged."""
    own = {n[4:] for n in logged if n.startswith("val/") and "/" not in n[4:]}
    names = ["loss", *sorted(n for n in own - {"loss"} if not _is_variant(n, own))]
    metrics = {name: ["Multiline", [f"^{GROUP}/{name}(_[^/]+)?$"]] for name in names}
    metrics["generalization gap (val loss - train loss)"] = ["Multiline", [f"^{GROUP}/generalization_gap$"]]
    return {
        "train vs validation": metrics,
        "optimization": {
            "learning rate": ["Multiline", ["^optimization/lr($|/)"]],
            "gradient norm before clipping": ["Multiline", ["^optimization/grad_norm($|/)"]],
            "share of steps clipped": ["Multiline", ["^optimization/clipped($|/)"]],
        },
        "speed": {
            "samples per second": ["Multiline", ["^speed/samples_per_sec$"]],
            "epoch time (s)": ["Multiline", ["^speed/epoch_time$"]],
            "share of training time waiting for data": ["Multiline", ["^speed/data_time_share$"]],
        },
    }


def _is_variant(name: str, names: set[str]) -> bool:
    """Whether ``name`` is another value's variant, named after it: ``acc_hgb`` beside ``acc``."""
    return any(name.startswith(f"{other}_") for other in names if other != name)


def run_hparams(trainer: L.Trainer, pl_module: L.LightningModule) -> HParams:
    """The hyperparameters people compare, from public state (see :data:`DISPLAY`): the optimizer's first
    parameter group, the scheduler, the net (``pl_module.net``, else the module) and its parameter count,
    the DataModule's batch size and data, the seed ``seed_everything`` set and the Trainer's settings.
    What is not known (no DataModule, no optimizer in a test) is left out."""
    net = getattr(pl_module, "net", None)
    net = net if isinstance(net, torch.nn.Module) else pl_module
    datamodule = getattr(trainer, "datamodule", None)
    data: Mapping[str, Any] = datamodule.hparams if datamodule is not None else {}
    values: dict[str, Any] = {
        "model": _qualname(pl_module),
        "net": _qualname(net),
        "net_params": sum(p.numel() for p in net.parameters()),
        "batch_size": data.get("batch_size", getattr(datamodule, "batch_size", None)),
        "data": next((str(data[key]) for key in DATA_KEYS if data.get(key) is not None), None),
        "epochs": trainer.max_epochs,
        "seed": os.environ.get("PL_GLOBAL_SEED"),  # set by lightning.seed_everything
        "precision": str(trainer.precision),
        "clip": trainer.gradient_clip_val,
        "accumulate": trainer.accumulate_grad_batches,
    }
    if trainer.optimizers:
        optimizer = trainer.optimizers[0]
        group = optimizer.param_groups[0]
        values["optimizer"] = _qualname(optimizer)
        values["lr"] = group.get("initial_lr", group.get("lr"))  # a scheduler keeps the first in initial_lr
        values["weight_decay"] = group.get("weight_decay")
    if trainer.lr_scheduler_configs:
        values["scheduler"] = _qualname(trainer.lr_scheduler_configs[0].scheduler)
    # None stays out: a column mixing None and numbers loses its type
    return {key: _plain(value) for key, value in values.items() if value is not None}


def _plain(value: Any) -> bool | int | float | str:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value if isinstance(value, bool | int | float | str) else str(value)


def experiment_pb(
    trainer: L.Trainer,
    pl_module: L.LightningModule,
    names: list[str],
    monitor: str,
    given: HParams | None = None,
) -> summary_pb2.Summary:
    """The HParams experiment: which columns the table has, in order. The best epoch's own values first
    (the monitored one leading), its number, the test values (the ``test`` run's ``metrics/<name>``),
    then the values named after another (the baselines').

    TensorBoard reads one experiment for every run it shows: runs of different kinds (a classifier's and a
    regressor's) in one folder share the columns of one of them.
    """
    own = [name for name in names if not _is_variant(name, set(names))]
    lead = monitor.removeprefix("val/")
    own.sort(key=lambda name: (name != lead, name != "loss", name))
    metrics = [_metric(f"{SUMMARY}/best_{name}", "", f"best {name}") for name in own]
    metrics.append(_metric(f"{SUMMARY}/best_epoch", "", "best epoch"))
    metrics += [_metric(f"{GROUP}/{name}", "test", f"test {name}") for name in own]
    metrics += [_metric(f"{SUMMARY}/best_{name}", "", f"best {name}") for name in names if name not in own]
    given = given or {}
    hparams = given | run_hparams(trainer, pl_module)
    types = {bool: api_pb2.DATA_TYPE_BOOL, str: api_pb2.DATA_TYPE_STRING}
    infos = [
        api_pb2.HParamInfo(
            name=name,
            display_name=DISPLAY.get(name, name),
            type=types.get(type(value), api_pb2.DATA_TYPE_FLOAT64),
            # TensorBoard's table shows five columns at first: those marked as differing between runs
            differs=name in HEADLINE or name in given,
        )
        for name, value in hparams.items()
    ]
    experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=metrics, time_created_secs=time.time())
    summary = summary_pb2.Summary()
    summary.value.add(
        tag=hparams_metadata.EXPERIMENT_TAG,
        metadata=hparams_metadata.create_summary_metadata(
            plugin_data_pb2.HParamsPluginData(experiment=experiment)
        ),
        tensor=hparams_metadata.NULL_TENSOR,
    )
    return summary


def _metric(tag: str, group: str, display: str) -> api_pb2.MetricInfo:
    return api_pb2.MetricInfo(name=api_pb2.MetricName(group=group, tag=tag), display_name=display)


def run_name(trainer: L.Trainer, writer: SummaryWriter) -> str:
    """The run's name in the HParams table, ``digits/version_3``: the logger's name and version, which
    tell two runs apart (a timestamp would not say which folder to open)."""
    logger = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
    if logger is None:
        return Path(writer.log_dir).name
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return f"{logger.name}/{version}"


def _session_end_pb(status: int) -> summary_pb2.Summary:
    """The HParams session-end summary (tensorboard's own writer for it needs TensorFlow)."""
    info = plugin_data_pb2.SessionEndInfo(status=status, end_time_secs=time.time())
    summary = summary_pb2.Summary()
    summary.value.add(
        tag=hparams_metadata.SESSION_END_INFO_TAG,
        metadata=hparams_metadata.create_summary_metadata(
            plugin_data_pb2.HParamsPluginData(session_end_info=info)
        ),
        tensor=hparams_metadata.NULL_TENSOR,
    )
    return summary


def environment_text(trainer: L.Trainer) -> str:
    """A Markdown table: versions, git commit, device and precision."""
    device = trainer.strategy.root_device
    rows = {
        "python": platform.python_version(),
        **{name: _version(name) for name in PACKAGES},
        "git commit": _git_commit(ROOT),
        "platform": platform.platform(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "accelerator": type(trainer.accelerator).__name__,
        "strategy": type(trainer.strategy).__name__,
        "processes": str(trainer.world_size),
        "precision": str(trainer.precision),
    }
    return "\n".join(["| | |", "|---|---|", *(f"| {key} | {value} |" for key, value in rows.items())])


def _git_commit(directory: Path) -> str:
    """The checkout's commit, marked when tracked files differ from it; ``none`` outside git."""

    def git(*words: str) -> str:
        done = subprocess.run(
            ["git", *words], cwd=directory, capture_output=True, text=True, timeout=10, check=True
        )
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "none (not a git checkout)"
    return f"{commit} (with uncommitted changes)" if dirty else commit


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _qualname(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _add_summary(writer: SummaryWriter, summary: summary_pb2.Summary) -> None:
    """Add a ready-made summary (HParams) to the run.

    Into the writer's own event file while it is open: a TensorBoard that watches a run reads only its
    newest event file, so a file of its own written at the start would hide every later scalar until
    TensorBoard is restarted. SummaryWriter has no method for a ready-made summary; its ``file_writer``
    (a public attribute, ``None`` once closed) has one. Once closed (a test run after a fit ends the
    session), a FileWriter of our own writes it to a file of its own, the run's last.
    """
    if writer.file_writer is not None:
        writer.file_writer.add_summary(summary)
        return
    own = FileWriter(writer.log_dir)
    own.add_summary(summary)
    own.close()


def _synchronize(trainer: L.Trainer) -> None:
    """Wait for queued device work, so a host clock read measures it; nothing to wait for on CPU."""
    device = trainer.strategy.root_device
    if device.type != "cpu":
        torch.accelerator.synchronize(device)
