"""What TensorBoard shows beside the losses and metrics the task logs itself.

Scalars follow one scheme, ``train/…``, ``val/…``, ``test/…``. The module logs its losses and metrics,
:class:`~src.callbacks.StepValues` the per-step values; the dashboard adds throughput, epoch time, the
share of time spent waiting for data and the generalization gap. Once per run it also writes a
custom-scalars layout (train and val on one chart) and the run's hyperparameters for the HParams table;
histograms and the model graph are optional. (The resolved config and the environment, as text, are
written by the CLI's config saver, ``src.cli.SaveConfig``.)

It reads only what any LightningModule logs: ``trainer.callback_metrics``. The gap needs ``train/loss``
and ``val/loss`` logged per epoch; the layout charts every ``val/<name>`` beside ``train/<name>``.

Every per-step hook here is host bookkeeping (a clock read, an integer add). Values reach the logger once
per epoch, so the dashboard adds no device sync per step.
"""

import importlib.metadata
import math
import platform
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.data import extract_batch_size
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.writer import FileWriter
from typing_extensions import override

from src.callbacks.baselines import MODELS, TAG
from src.callbacks.steps import write
from src.errors import UserInputError

ROOT = Path(__file__).resolve().parent.parent.parent
#: Trainer settings that change what a run learns; the rest (callbacks, logger, ...) stay out of HParams.
TRAINER_HPARAMS = (
    "max_epochs",
    "max_steps",
    "precision",
    "accumulate_grad_batches",
    "gradient_clip_val",
    "gradient_clip_algorithm",
)
PACKAGES = ("torch", "lightning", "torchmetrics", "tensorboard", "numpy", "scikit-learn", "jsonargparse")

HParams = dict[str, bool | int | float | str]
#: the run's sub-folder that holds its HParams session and the metrics the table shows
SESSION_FOLDER = "hparams"
#: what the dashboard logs itself under val/, charted in the speed section instead
SPEED = {"epoch_time", "generalization_gap"}


class Dashboard(Callback):
    """Speed, generalization gap, HParams and layout; histograms and graph on request.

    Args:
        histogram_every_n_epochs: Write weight and gradient histograms (``weights/<param>``,
            ``grads/<param>``) at the first optimizer step of every n-th epoch; 0 turns them off.
        log_graph: Trace the net (``pl_module.net`` when the module has one, else the whole module) once
            on the first training batch and write its graph (Graphs tab).
    """

    def __init__(self, histogram_every_n_epochs: int = 0, log_graph: bool = False) -> None:
        if histogram_every_n_epochs < 0:
            raise UserInputError(
                f"Dashboard histogram_every_n_epochs={histogram_every_n_epochs} must be 0 (off) or a "
                "positive number of epochs."
            )
        self.histogram_every_n_epochs = histogram_every_n_epochs
        self.log_graph = log_graph
        self._sessions: dict[str, SummaryWriter] = {}  # the HParams writer of each run, by run folder
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
        # a fit writes its session once the optimizer exists (on_fit_start): its defaults are recorded too
        if stage not in ("fit", "predict"):
            self._start_session(trainer, pl_module)
        self._layout_written = stage != "fit"

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validations = []
        self._start_session(trainer, pl_module)

    def _start_session(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The HParams session, in the run's ``hparams`` sub-folder: TensorBoard's table takes as metric
        columns every scalar of a session's folder, so the session has a folder of its own that holds only
        the chosen metrics (:meth:`_write_session_metrics`), not the run's every curve."""
        writer = tensorboard_writer(trainer)
        # the writer's own folder, not trainer.log_dir: that one is a collective under DDP, and only
        # rank 0 gets here
        if writer is None or writer.log_dir in self._sessions:
            return
        # fit followed by test in one process shares the run: it is written once
        session = self._sessions[writer.log_dir] = SummaryWriter(str(Path(writer.log_dir) / SESSION_FOLDER))
        # no experiment summary: TensorBoard then takes the union of all runs' hyperparameters and
        # metrics, so runs of different configs share one HParams table
        hparams = run_hparams(trainer, pl_module)
        _add_summary(session, hparams_summary.hparams_pb(hparams, trial_id=run_name(trainer, writer)))
        session.flush()

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write_gap(trainer)
        self._write_best(trainer)
        self._end_session(trainer, api_pb2.STATUS_SUCCESS)

    @override
    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        session = self._session(trainer)
        if session is not None:
            # the test metrics, as the HParams table's columns (a number each, at the fit's last step)
            for name, value in trainer.callback_metrics.items():
                if name.startswith("test/") and value.numel() == 1:
                    session.add_scalar(name, value.item(), trainer.global_step)
        self._end_session(trainer, api_pb2.STATUS_SUCCESS)

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._end_session(trainer, api_pb2.STATUS_FAILURE)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # closed, but kept: a test after the fit, in the same process, adds its metrics to the same
        # session (a closed SummaryWriter opens a new event file in its folder when written to again)
        for session in self._sessions.values():
            session.close()

    def _session(self, trainer: L.Trainer) -> SummaryWriter | None:
        writer = tensorboard_writer(trainer)
        return self._sessions.get(writer.log_dir) if writer is not None else None

    def _end_session(self, trainer: L.Trainer, status: int) -> None:
        """The HParams table's status column: success, or failure when the run raised."""
        session = self._session(trainer)
        if session is not None:
            _add_summary(session, _session_end_pb(status))
            session.flush()

    def _write_best(self, trainer: L.Trainer) -> None:
        """The HParams metrics of a fit: at its best validation epoch (by the monitored value), that
        epoch's validation values as ``val/best_<name>``, ``val/best_epoch``, and the baselines' values."""
        session = self._session(trainer)
        monitor, mode = monitored(trainer)
        scored = [v for v in self._validations if math.isfinite(v[2].get(monitor, math.nan))]
        if session is None or not scored:
            return
        epoch, step, values = (min if mode == "min" else max)(scored, key=lambda v: v[2][monitor])
        for name, value in values.items():
            if TAG.fullmatch(name):  # a baseline's, the same at every epoch
                session.add_scalar(name, value, step)
            elif name.startswith("val/") and name[4:] not in SPEED:
                session.add_scalar(f"val/best_{name[4:]}", value, step)
        session.add_scalar("val/best_epoch", epoch, step)
        session.flush()

    # -- speed and the generalization gap, per epoch --------------------------------------------------

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write_gap(trainer)
        self._epoch_start = self._mark = time.perf_counter()
        self._data_time = self._step_time = 0.0
        self._samples = 0

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
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
        pl_module.log("val/epoch_time", time.perf_counter() - self._val_start, sync_dist=True)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _synchronize(trainer)
        train_time = self._data_time + self._step_time
        # sync_dist: one all-reduce per epoch (the mean over processes), none per step
        pl_module.log("train/epoch_time", time.perf_counter() - self._epoch_start, sync_dist=True)
        if train_time > 0:
            # every process runs the same number of equally sized batches
            pl_module.log(
                "train/samples_per_sec", self._samples * trainer.world_size / train_time, sync_dist=True
            )
            pl_module.log("train/data_time_share", self._data_time / train_time, sync_dist=True)
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
                writer.add_histogram(f"grads/{name}", param.grad, step)

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
    """The custom-scalars layout: each validation value's train and val curves on one chart (tags are
    regexes); ``logged`` holds what the module logged (``val/loss``, ``val/acc`` ...)."""
    own = {n[4:] for n in logged if n.startswith("val/") and n[4:] != "loss" and not TAG.fullmatch(n)}
    names = ["loss", *sorted(own - SPEED)]

    def chart(*tags: str) -> list[Any]:
        return ["Multiline", [f"^{tag}$" for tag in tags]]

    # the baselines' values (val/acc_hgb) on their metric's chart, flat lines to beat
    baselines = {m[2] for n in logged if (m := TAG.fullmatch(n)) and m[1] == "val"}
    models = "|".join(MODELS)
    train_vs_val = {
        name: chart(
            f"train/{name}", f"val/{name}", *([f"val/{name}_({models})"] if name in baselines else [])
        )
        for name in names
    }
    train_vs_val["generalization gap (val loss - train loss)"] = chart("val/generalization_gap")
    return {
        "train vs val": train_vs_val,
        "optimization": {
            "learning rate": ["Multiline", ["^train/lr($|/)"]],
            "gradient norm before clipping": chart("train/grad_norm"),
            "clipping fired (1 = yes)": chart("train/grad_clipped"),
        },
        "speed": {
            "samples per second": chart("train/samples_per_sec"),
            "epoch time (s)": chart("train/epoch_time", "val/epoch_time"),
            "share of training time waiting for data": chart("train/data_time_share"),
        },
    }


def run_hparams(trainer: L.Trainer, pl_module: L.LightningModule) -> HParams:
    """The run's hyperparameters as flat ``bool | int | float | str`` values for the HParams table.

    From the CLI's resolved config when there is one (``model.optimizer.lr``, ``data.batch_size``,
    ``trainer.max_epochs`` …), else from the module's and the DataModule's saved hyperparameters.
    """
    config = cli_config(trainer)
    if config is not None:
        resolved = config.config.as_dict()
        tree = {key: resolved.get(key) for key in ("seed_everything", "model", "data")}
        tree["trainer"] = {key: resolved["trainer"].get(key) for key in TRAINER_HPARAMS}
    else:
        datamodule = getattr(trainer, "datamodule", None)
        tree = {
            "model": {"class_path": _qualname(pl_module), **pl_module.hparams},
            "data": dict(datamodule.hparams) if datamodule is not None else {},
            "trainer": {key: getattr(trainer, key) for key in TRAINER_HPARAMS},
        }
    flat = _flatten(tree)
    optimizers = trainer.optimizers if trainer.state.fn == TrainerFn.FITTING else []
    if optimizers and "model.optimizer" not in flat:
        # the module built its optimizer itself (a default, or its own configure_optimizers): what it used
        flat["model.optimizer"] = _qualname(optimizers[0])
        group = optimizers[0].param_groups[0]
        for key, value in group.items():
            if isinstance(value, bool | int | float | str) and key != "params":
                flat[f"model.optimizer.{key}"] = value
    return flat


def run_name(trainer: L.Trainer, writer: SummaryWriter) -> str:
    """The run's name in the HParams table, ``digits/version_3``: the logger's name and version, which
    tell two runs apart (a timestamp would not say which folder to open)."""
    logger = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
    if logger is None:
        return Path(writer.log_dir).name
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return f"{logger.name}/{version}"


def monitored(trainer: L.Trainer) -> tuple[str, str]:
    """The value the best checkpoint is chosen by, and whether lower or higher is better (``val/loss``,
    lower, when no checkpoint or early stopping monitors one)."""
    checkpoint = trainer.checkpoint_callback
    if isinstance(checkpoint, ModelCheckpoint) and checkpoint.monitor:
        return checkpoint.monitor, checkpoint.mode
    stopper = trainer.early_stopping_callback
    if isinstance(stopper, EarlyStopping):
        return stopper.monitor, stopper.mode
    return "val/loss", "min"


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


def _flatten(tree: dict[str, Any], prefix: str = "") -> HParams:
    """``{"model": {"class_path": C, "init_args": {"lr": 1}}}`` → ``{"model": C, "model.lr": 1}``."""
    flat: HParams = {}
    for key, value in tree.items():
        name = prefix if key == "init_args" else f"{prefix}.{key}" if prefix else key
        if key == "class_path":
            flat[prefix] = value
        elif isinstance(value, dict):
            flat.update(_flatten(value, name))
        elif isinstance(value, bool | int | float | str):
            flat[name] = value
        elif value is not None:  # None stays out: a column mixing None and numbers loses its type
            flat[name] = str(value)
    return flat


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


def cli_config(trainer: L.Trainer) -> SaveConfigCallback | None:
    """The CLI's config saver, which holds the resolved config and its parser; None outside the CLI."""
    # Trainer.callbacks is public and documented, but Lightning assigns it in its callback connector
    # without declaring it on the class, so mypy cannot see it
    callbacks = trainer.callbacks  # type: ignore[attr-defined]
    return next((c for c in callbacks if isinstance(c, SaveConfigCallback)), None)


def tensorboard_writer(trainer: L.Trainer) -> SummaryWriter | None:
    """The TensorBoard writer on the process that writes (global rank 0); None elsewhere."""
    if not trainer.is_global_zero:
        return None
    logger = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
    return logger.experiment if logger is not None else None


def logging_step(trainer: L.Trainer) -> int:
    """The step Lightning gives the values logged after a training step (in validation, at an epoch's end),
    so images line up with them: the index of the last optimizer step.

    Lightning's own counter is private; the public ``global_step`` (optimizer steps taken) is one more
    under automatic optimization with one optimizer. Under manual optimization it counts optimizer
    steps, not batches, so with accumulation the images sit at earlier steps than the scalars.
    """
    return max(trainer.global_step - 1, 0)


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
