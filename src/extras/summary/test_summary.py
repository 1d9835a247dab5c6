"""The terminal tells the story of a run: the bar, the model summary, and the summary at the fit's end.

The summary is held to what a run really did: a plain LightningModule of the user's own with a scripted
validation loss, so the best epoch, the reason the fit ended and the advice are known in advance.
"""

import logging
import re
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from src.cli import main
from src.errors import UserInputError
from src.extras.summary import ROOT, ModelSummary, RunSummary, summary_text, viewers
from src.extras.summary.progress import ProgressBar
from tests.conftest import CONFIGS, QUIET
from tests.helpers import MANY_LABELS, MANY_VALUES
from tests.test_cli import SMALL

# these tests also need the extras below; without one of them they are skipped
NonFiniteGuard = pytest.importorskip("src.extras.guard").NonFiniteGuard


class Scripted(L.LightningModule):
    """A user's module whose val/loss of epoch ``e`` is ``script[e]`` (and val/acc ``1 - script[e]``)."""

    def __init__(self, script: list[float], nan_from: int = -1, acc: bool = True) -> None:
        super().__init__()
        self.script = script
        self.nan_from = nan_from
        self.acc = acc
        self.layer = nn.Linear(2, 1)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        if 0 <= self.nan_from <= self.global_step:
            loss = loss * float("nan")
        return loss

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        value = self.script[self.current_epoch]
        self.log("val/loss", value)
        if self.acc:
            self.log("val/acc", 1 - value)
        else:  # a value of its own, which no reference logs
            self.log("val/bce", 2 * value)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)


def fit(
    tmp_path: Path,
    script: list[float],
    *callbacks: L.Callback,
    nan_from: int = -1,
    acc: bool = True,
    summary: RunSummary | None = None,
    **trainer: Any,
) -> None:
    run = L.Trainer(
        default_root_dir=tmp_path,
        max_epochs=len(script),
        callbacks=[ModelCheckpoint(monitor="val/loss", mode="min"), summary or RunSummary(), *callbacks],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **trainer,
    )
    run.fit(Scripted(script, nan_from, acc), loader(), loader())


def test_early_stopping_says_why_and_where_the_best_epoch_is(tmp_path: Path, capsys) -> None:
    script = [0.9, 0.5, 0.3, 0.4, 0.45, 0.5, 0.6, 0.7]  # best at epoch 2, then worse: stops at epoch 4
    fit(tmp_path, script, EarlyStopping(monitor="val/loss", patience=2))
    out = capsys.readouterr().out
    said = " ".join(out.split())  # sentences wrapped to 80 columns
    assert "Fit ended: early stopping at epoch 4 (max_epochs 8): val/loss did not improve for 2 " in said
    assert "Best epoch 2 (by val/loss):\n  val/loss 0.3   val/acc 0.7\n" in out
    assert Path(tmp_path, "lightning_logs/version_0/checkpoints/epoch=2-step=6.ckpt").is_file()
    # inside the run folder, said once: relative to it
    assert "Best checkpoint: checkpoints/epoch=2-step=6.ckpt\n" in out
    # the run's own viewer: Lightning's default logger is TensorBoard's, outside the repository's logs/
    folder = Path(tmp_path, "lightning_logs/version_0").resolve()
    assert f"TensorBoard:     tensorboard --logdir {folder}\n" in out
    assert "still improving" not in out  # it stopped early: nothing to raise


@pytest.mark.parametrize(
    ("script", "advised"),
    [
        ([0.9, 0.8, 0.7, 0.6, 0.5], True),  # best at the last epoch
        ([0.9, 0.8, 0.7, 0.72, 0.71], True),  # best within the last three
        ([0.5, 0.6, 0.7, 0.8, 0.9], False),  # best at the first, long ago
    ],
)
def test_a_cap_reached_while_improving_says_to_raise_it(tmp_path: Path, capsys, script, advised) -> None:
    fit(tmp_path, script)
    out = " ".join(capsys.readouterr().out.split())  # sentences wrapped to 80 columns
    assert f"Fit ended: reached trainer.max_epochs={len(script)} after {len(script)} epochs" in out
    sentence = "val/loss was still improving when the run reached trainer.max_epochs=5"
    assert (sentence in out) is advised
    assert ("raise trainer.max_epochs (--trainer.max_epochs=10)" in out) is advised


def test_a_max_steps_cap_advises_max_steps(tmp_path: Path, capsys) -> None:
    fit(tmp_path, [0.9, 0.8, 0.7, 0.6], max_steps=6)  # 2 steps an epoch: ends after epoch 2
    out = " ".join(capsys.readouterr().out.split())
    assert "reached trainer.max_steps=6" in out
    assert "raise trainer.max_steps (--trainer.max_steps=12)" in out


class FakeBaselines(L.Callback):
    """Logs what a baselines callback logs: ``val/<metric>_<model>``, a value per epoch."""

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch
        pl_module.log("val/acc_hgb", 0.5 + epoch / 100)
        pl_module.log("val/acc_linear", 0.4 + epoch / 100)
        pl_module.log("val/loss_linear", 2.0)


def test_baselines_stand_beside_the_nets_values_at_the_best_epoch(tmp_path: Path, capsys) -> None:
    fit(tmp_path, [0.9, 0.2, 0.5], FakeBaselines())
    out = capsys.readouterr().out
    table = out.split("Best epoch 1 (by val/loss):\n", 1)[1].splitlines()[:3]
    assert [line.split() for line in table] == [
        ["net", "hgb", "linear"],
        ["val/loss", "0.2", "-", "2"],
        ["val/acc", "0.8", "0.51", "0.41"],  # epoch 1's baselines, not the last epoch's
    ]


def test_a_reference_stands_only_beside_the_nets_value_of_the_same_name(tmp_path: Path, capsys) -> None:
    """A module that logs no val/acc: the baselines' val/acc_hgb and val/acc_linear are no score of the net's,
    so they stand nowhere; val/loss_linear still stands beside val/loss."""
    summary = RunSummary(references=["hgb", "linear"])  # as configs/defaults.yaml names the baselines'
    fit(tmp_path, [0.9, 0.2, 0.5], FakeBaselines(), acc=False, summary=summary)
    out = capsys.readouterr().out
    table = out.split("Best epoch 1 (by val/loss):\n", 1)[1].splitlines()[:4]
    assert [line.split() for line in table[:3]] == [
        ["net", "linear"],
        ["val/loss", "0.2", "2"],
        ["val/bce", "0.4", "-"],
    ]
    assert not table[3].startswith("  val/")  # no row of a score the net did not log
    assert "acc" not in out


class LateBaselines(L.Callback):
    """Logs its reference only from epoch 2 on, as the baselines do once their background fit is in."""

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch >= 2:
            pl_module.log("val/acc_hgb", 0.5 + trainer.current_epoch / 100)
            pl_module.log("val/other", 7.0)  # named after none of the net's values: not a reference


def test_a_reference_logged_after_the_best_epoch_still_stands_beside_it(tmp_path: Path, capsys) -> None:
    fit(tmp_path, [0.9, 0.2, 0.5, 0.6], LateBaselines())
    out = capsys.readouterr().out
    table = out.split("Best epoch 1 (by val/loss):\n", 1)[1].splitlines()[:3]
    assert [line.split() for line in table] == [
        ["net", "hgb"],
        ["val/loss", "0.2", "-"],
        ["val/acc", "0.8", "0.53"],  # the last epoch's, the one that logged it last
    ]


def test_a_csv_logger_is_named_by_its_metrics_file_and_gets_no_tensorboard_line(
    tmp_path: Path, capsys
) -> None:
    fit(tmp_path, [0.9, 0.8], logger=CSVLogger(tmp_path, name="csv"))
    out = capsys.readouterr().out
    metrics = Path(tmp_path, "csv/version_0/metrics.csv").resolve()
    assert f"Metrics:         {metrics}\n" in out
    assert metrics.is_file()
    assert "TensorBoard" not in out  # no event file to open: none was written
    assert not list(tmp_path.rglob("events.out.tfevents.*"))


def test_tensorboard_is_named_by_make_for_the_repositorys_logs_and_by_a_relative_path_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a run under the repository's logs/, typed from the repository: the Makefile's target serves logs/
    monkeypatch.chdir(ROOT)
    assert viewers([TensorBoardLogger(ROOT / "logs", name="penguins")]) == [
        "TensorBoard:     make tensorboard"
    ]
    # anywhere else, the folder as typed from the working directory
    monkeypatch.chdir(tmp_path)
    logger = TensorBoardLogger(tmp_path / "runs", name="mine", version=3)
    assert viewers([logger]) == ["TensorBoard:     tensorboard --logdir runs/mine/version_3"]
    monkeypatch.chdir(tmp_path / "..")
    assert viewers([logger]) == [f"TensorBoard:     tensorboard --logdir {tmp_path.name}/runs/mine/version_3"]


def test_the_guard_stopping_a_run_is_part_of_its_story(tmp_path: Path, capsys) -> None:
    with pytest.raises(UserInputError, match="non-finite gradients"):
        fit(tmp_path, [0.9, 0.8, 0.7, 0.6], NonFiniteGuard(max_consecutive=3), nan_from=3)
    out = " ".join(capsys.readouterr().out.split())
    # the guard's own sentence, read from the error it raised: the summary knows no guard
    assert "Fit ended: stopped at epoch 2: 3 optimizer steps in a row had non-finite gradients" in out
    assert "Best epoch 1 (by val/loss):" in out  # what was validated before it


def test_model_summary_rows_are_blocks_with_parameters() -> None:
    # Lightning's columns, as its ModelSummary callback hands them to summarize()
    data = [
        ("Name", ["net", "metrics", "losses"]),
        ("Type", ["MLP", "ModuleDict", "ModuleDict"]),
        ("Params", ["50.8 K", "0", "0"]),
        ("Mode", ["train", "train", "train"]),
        ("FLOPs", ["0", "0", "0"]),
    ]
    assert summary_text(data, 50_800, 50_000, 0.2032).splitlines() == [
        "block  type  params",
        "net    MLP   50.8 K",
        "50.8 K parameters (800 frozen), 0.20 MB",
    ]


DIGITS = [
    "fit", "--config", str(CONFIGS / "digits.yaml"), "--trainer.max_epochs=2",
    "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2", "--baselines=null",
]  # fmt: skip


def test_the_cli_prints_model_summary_bar_values_and_summary(workdir: Path, capsys) -> None:
    run = main(DIGITS)
    captured = capsys.readouterr()
    out = captured.out
    assert "block  type  params\nnet    MLP   50.8 K\n" in out
    assert "FLOPs" not in out + captured.err
    assert "ModuleDict" not in out
    assert re.search(r"Fit ended: reached trainer.max_epochs=2 after 2 epochs", out)
    assert f"Run folder:      {Path(run.trainer.log_dir)}" in out
    # the bar shows the validation loss and the main metric, as the trainer holds them
    [bar] = [c for c in run.trainer.callbacks if isinstance(c, ProgressBar)]
    shown = bar.get_metrics(run.trainer, run.model)
    # the monitored value, first, to 4 significant digits
    assert next(iter(shown)) == "val/loss"
    assert shown["val/loss"] == f"{run.trainer.callback_metrics['val/loss'].item():.4g}"
    assert "val/acc" not in shown  # not asked for: shown with `show: [val/acc]`
    assert "Epoch 1, val/loss=" in out  # Lightning's tqdm bar writes to stdout


def test_without_the_bar_only_the_summary_prints(workdir: Path, capsys) -> None:
    main([*DIGITS, "--trainer.enable_progress_bar=false"])
    captured = capsys.readouterr()
    assert "Fit ended: reached trainer.max_epochs=2" in captured.out
    assert "block  type  params" not in captured.out
    assert "Epoch 1" not in captured.out + captured.err


def test_model_summary_switched_off_as_lightning_says(workdir: Path, capsys) -> None:
    main([*DIGITS, "--trainer.enable_model_summary=false"])
    assert "block  type  params" not in capsys.readouterr().out


def test_no_log_interval_warning_on_a_short_dataset(workdir: Path) -> None:
    # Lightning warns on its own: 3 batches an epoch, log_every_n_steps=10 ...
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        L.Trainer(
            max_epochs=1, log_every_n_steps=10, enable_progress_bar=False, enable_model_summary=False
        ).fit(Scripted([0.5]), DataLoader(TensorDataset(torch.randn(12, 2)), batch_size=4), loader())
    assert any("smaller than the logging interval" in str(w.message) for w in seen)
    # ... the CLI does not: StepValues counts steps across epochs, so nothing is lost to it
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        main([*DIGITS, "--trainer.enable_progress_bar=false"])
    assert not [w for w in seen if "logging interval" in str(w.message)]


def test_no_line_about_counting_the_steps_of_a_schedule_that_spans_the_run(workdir: Path, caplog) -> None:
    # configs/digits.yaml's schedule spans the run, so Lightning counts its steps from the loader and says so
    with caplog.at_level(logging.INFO):
        main([*DIGITS, "--trainer.enable_progress_bar=false"])
    assert "GPU available" in caplog.text  # Lightning's own lines are captured here ...
    assert not [r for r in caplog.records if "estimate number of stepping batches" in r.getMessage()]


class Clipped(L.Callback):
    """Logs what StepValues logs for the summary: the fit's share of clipped steps."""

    def __init__(self, share: float) -> None:
        self.share = share

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.log("train/optimization/clipped_share", self.share, logger=False)


@pytest.mark.parametrize(("share", "said"), [(0.89, True), (0.4, False)])
def test_clipping_most_steps_says_what_to_try(tmp_path: Path, capsys, share: float, said: bool) -> None:
    fit(tmp_path, [0.9, 0.8], Clipped(share), gradient_clip_val=0.5)
    out = " ".join(capsys.readouterr().out.split())
    sentence = "Clipping cut the gradients of 89% of the optimizer steps (trainer.gradient_clip_val=0.5)"
    assert (sentence in out) is said
    assert ("Raise it above the usual gradient norm" in out) is said


def test_every_line_of_the_summary_fits_80_columns(tmp_path: Path, capsys) -> None:
    fit(tmp_path, [0.9, 0.8, 0.7, 0.6, 0.5], Clipped(0.95), gradient_clip_val=0.5)
    lines = capsys.readouterr().out.splitlines()
    said = [line for line in lines if not line.startswith(("Run folder", "TensorBoard", "Best checkpoint"))]
    assert any("still improving" in line for line in said)
    assert max(len(line) for line in said) <= 80


def test_lightnings_own_ending_line_is_left_to_the_summary(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.INFO):
        fit(tmp_path, [0.9, 0.8])
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if m.startswith("`Trainer.fit` stopped")]
    # left out during the fit only: the filter is gone after it
    from src.extras.summary import _without_lightnings_ending

    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    assert _without_lightnings_ending not in rank_zero.filters


def test_the_bar_keeps_the_monitored_value_whole_in_80_columns() -> None:
    from tqdm import tqdm

    from src.extras.summary.progress import BAR_FORMAT

    line = tqdm.format_meter(
        7, 20, 1.5, ncols=80, prefix="Epoch 59", bar_format=BAR_FORMAT,
        postfix="val/loss=0.04481, val/acc=0.9861, loss=0.0004484",
    )  # fmt: skip
    assert len(line) <= 80
    assert line.startswith("Epoch 59, val/loss=0.04481, val/acc=0.9861, loss=0.0004484 |")
    assert "7/20" in line


def test_a_refusal_before_the_first_step_is_the_one_sentence_alone(
    cli, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fit refused as its optimizers are built has no story to tell: no "Fit ended", one error line."""
    words = ["--config", "spiral.yaml", "--data.num_samples=300", "--config", "trainer/warmup_cosine.yaml"]
    with pytest.raises(SystemExit) as stopped:
        cli("fit", *words, "--model.init_args.scheduler.init_args.warmup_steps=9999")
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    assert "Fit ended" not in out
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        next(line for line in err.splitlines() if "warmup_steps=9999 must lie in" in line)
    ]


def test_the_progress_bar_section_unless_the_bar_is_off(workdir: Path) -> None:
    run = main([*SMALL, "--trainer.enable_model_summary=false"], run=False)
    assert type(run.trainer.progress_bar_callback) is ProgressBar
    plain = main([*SMALL, "--trainer.enable_model_summary=false", "--progress_bar=null"], run=False)
    assert type(plain.trainer.progress_bar_callback).__name__ == "TQDMProgressBar"  # Lightning's own
    quiet = main([*SMALL, *QUIET], run=False)
    assert quiet.trainer.progress_bar_callback is None


def test_the_bar_and_the_model_summary_make_train_turns_on_stand_in_for_lightnings_own(workdir: Path) -> None:
    """Lightning's own bar and summary step aside for this extra's, which are no further callbacks."""
    run = main(["--config", str(CONFIGS / "digits.yaml")], run=False)
    assert type(run.trainer.progress_bar_callback) is ProgressBar
    summaries = [c for c in run.trainer.callbacks if isinstance(c, LightningModelSummary)]
    assert [type(c) for c in summaries] == [ModelSummary]


@pytest.mark.parametrize(
    ("kind", "own"), [("labels", ["loss", "acc", "f1"]), ("values", ["loss", "mae", "r2"])]
)
def test_a_users_k_target_task_gets_its_own_best_values_and_its_own_viewer(cli, capsys, kind, own) -> None:
    """tests/helpers.py's multi-label and multi-output tasks under every shipped default: the best epoch's
    line holds the values the module logs, as they were at that epoch, with no reference beside them (no
    table: the baselines say they do not apply), and the viewer is its TensorBoard run, by its path here."""
    words = MANY_LABELS if kind == "labels" else MANY_VALUES
    fit = cli("fit", *words, "--trainer.max_epochs=3")
    out = capsys.readouterr().out
    checkpoint = fit.trainer.checkpoint_callback
    best = torch.load(checkpoint.best_model_path, weights_only=True)["epoch"]
    line = out.split(f"Best epoch {best} (by val/loss):\n", 1)[1].splitlines()[0].split()
    assert line[::2] == [f"val/{name}" for name in own]  # the module's own values, and nothing else
    assert float(line[1]) == pytest.approx(float(checkpoint.best_model_score), rel=1e-3)  # that epoch's
    assert f"TensorBoard:     tensorboard --logdir {fit.trainer.log_dir}\n" in out  # relative to here
