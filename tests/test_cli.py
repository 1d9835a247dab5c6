"""The command line, driven in-process exactly as a user types it."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint, ModelSummary, ProgressBar

from src.cli import DEFAULTS, callback_sections, main
from src.models import Classifier, Regressor
from src.nets import MLP
from tests.conftest import BARE, CONFIGS, ONE_PASS, QUIET, ROOT

EXPERIMENTS = sorted(p for p in CONFIGS.glob("*.yaml") if p.name != "defaults.yaml")
FRAGMENTS = sorted((CONFIGS / "trainer").glob("*.yaml"))
# fragments that launch processes or compile for tens of seconds run in their own tests instead
COVERED_ELSEWHERE = {
    "ddp.yaml": "test_distributed.py",
    "fsdp.yaml": "test_distributed.py",
    "compile.yaml": "test_compile.py",
}
TINY = ["--trainer.max_epochs=2", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2"]


@pytest.mark.slow
@pytest.mark.parametrize("config", EXPERIMENTS, ids=lambda p: p.name)
def test_every_shipped_config_runs_fast_dev_run(config: Path, cli) -> None:
    run = cli("fit", "--config", str(config), "--trainer.fast_dev_run=true")
    assert run.trainer.state.finished
    assert run.trainer.global_step == 1
    assert torch.isfinite(run.trainer.callback_metrics["val/loss"])


# what a fragment needs to run in a couple of steps (the warmup must end before the run does)
FRAGMENT_ARGS = {
    "warmup_cosine.yaml": ["--trainer.fast_dev_run=2", "--model.init_args.scheduler.init_args.warmup_steps=1"]
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "fragment", [f for f in FRAGMENTS if f.name not in COVERED_ELSEWHERE], ids=lambda p: p.name
)
def test_every_trainer_fragment_stacks_on_an_experiment(fragment: Path, cli) -> None:
    extra = FRAGMENT_ARGS.get(fragment.name, ["--trainer.fast_dev_run=1"])
    args = ("fit", "--config", "spiral.yaml", "--config", str(fragment), *extra)
    if fragment.name == "fp16.yaml":  # CUDA-only: on CPU Lightning says it runs bf16-mixed instead
        with pytest.warns(UserWarning, match="Using `precision='bf16-mixed'` instead"):
            run = cli(*args)
    else:
        run = cli(*args)
    assert run.trainer.state.finished
    assert run.trainer.global_step == run.trainer.fast_dev_run
    assert torch.isfinite(run.trainer.callback_metrics["val/loss"])


@pytest.mark.parametrize(("fragment", "test_file"), sorted(COVERED_ELSEWHERE.items()))
def test_fragments_left_out_above_are_run_by_their_own_tests(fragment: str, test_file: str) -> None:
    assert (CONFIGS / "trainer" / fragment).is_file()
    assert f'"{fragment}"' in (Path(__file__).parent / test_file).read_text()


@pytest.mark.slow
def test_fit_test_predict_round_trip(cli, workdir: Path) -> None:
    fit = cli("fit", "--config", "spiral.yaml", "--data.num_samples=600", *TINY)
    best = fit.trainer.checkpoint_callback.best_model_path
    assert Path(best).is_file()
    # last.ckpt holds the final state, not a copy of the best epoch, so --ckpt_path last resumes there
    last = torch.load(Path(fit.trainer.log_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == fit.trainer.global_step
    assert last["epoch"] == fit.trainer.max_epochs  # written at the fit's end: the epochs done
    fit_config = (Path(fit.trainer.log_dir) / "config.yaml").read_bytes()

    test = cli("test", "--config", "spiral.yaml", "--data.num_samples=600", "--ckpt_path", best)
    metrics = test.trainer.callback_metrics
    assert {"test/loss", "test/acc", "test/f1"} <= set(metrics)
    assert 0.0 <= metrics["test/acc"].item() <= 1.0

    predict = cli("predict", "--config", "spiral.yaml", "--data.num_samples=600", "--ckpt_path", best)
    written = next(c for c in predict.trainer.callbacks if hasattr(c, "written")).written
    # beside the run the checkpoint came from, not in a new version folder
    assert written == Path(fit.trainer.log_dir).resolve() / "predictions.csv"
    frame = pd.read_csv(written)
    labels = ["probability(0)", "probability(1)", "probability(2)"]
    assert list(frame.columns) == ["row", "prediction", *labels]
    # without data.predict_path: one line per validation row (never the test split), naming it
    rows = predict.datamodule.split_rows
    assert frame["row"].tolist() == rows["val"].tolist()
    assert not set(frame["row"]) & set(rows["test"].tolist())
    assert frame["prediction"].dtype.kind == "i"
    assert (frame["prediction"] == frame[labels].to_numpy().argmax(1)).all()
    assert not list(written.parent.glob("*.partial"))
    # test and predict of the run's checkpoint log inside the run's own folder, not a new version_N,
    # and leave its config.yaml as fit wrote it
    run_folder = Path(fit.trainer.log_dir).resolve()
    assert [p.name for p in run_folder.parent.iterdir()] == [run_folder.name]
    assert (run_folder / "config.yaml").read_bytes() == fit_config
    assert Path(test.trainer.log_dir).parent == run_folder
    assert (Path(test.trainer.log_dir) / "config.yaml").is_file()
    assert Path(test.trainer.log_dir).name == f"test-{Path(best).stem}"
    # predict logs nothing: no folder, no config.yaml, here or in the folder it was started from
    assert predict.trainer.logger is None
    assert not [p.name for p in run_folder.iterdir() if p.is_dir() and p.name.startswith("predict")]
    assert not (workdir / "config.yaml").exists()


def test_fit_then_test_after_fit_uses_the_best_checkpoint(cli, capsys) -> None:
    run = cli("fit", "--config", "diabetes.yaml", *TINY, "--test_after_fit=true")
    best = run.trainer.checkpoint_callback.best_model_path
    assert f"Testing the best checkpoint: {best}" in capsys.readouterr().out
    assert "test/r2" in run.trainer.callback_metrics


@pytest.mark.slow
def test_checkpoint_holds_only_data_and_loads_back(cli) -> None:
    run = cli("fit", "--config", "digits.yaml", *TINY)
    path = run.trainer.checkpoint_callback.best_model_path
    checkpoint = torch.load(path, weights_only=True)  # no pickled code: safe to load
    assert checkpoint["hyper_parameters"]["out_features"] == 10
    # the net as the config named it (class and arguments), which is how the checkpoint rebuilds it
    net = checkpoint["hyper_parameters"]["net"]
    assert (net["class_path"], net["init_args"]["hidden_sizes"]) == ("src.nets.MLP", [256, 128])
    model = Classifier.load_from_checkpoint(path)  # no extra arguments needed
    assert isinstance(model.net, MLP)
    for name, tensor in run.model.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], checkpoint["state_dict"][name])
        assert tensor.shape == model.state_dict()[name].shape


def test_regressor_checkpoint_carries_target_statistics(cli) -> None:
    run = cli("fit", "--config", "diabetes.yaml", *TINY)
    model = Regressor.load_from_checkpoint(run.trainer.checkpoint_callback.best_model_path)
    y = run.datamodule.train_targets().astype(np.float64)
    mean, std = y.mean(), y.std()
    assert model.target_mean.item() == pytest.approx(mean)
    assert model.target_std.item() == pytest.approx(std)


#: the shipped MLP's dropout, one of the net's own arguments under the task's ``net``
DROPOUT = "model.init_args.net.init_args.dropout"


def test_print_config_round_trips(cli, capsys, workdir: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli("fit", "--config", "friedman.yaml", f"--{DROPOUT}=0.3", "--print_config")
    assert exit_.value.code == 0
    dumped = capsys.readouterr().out
    (workdir / "dumped.yaml").write_text(dumped)
    with pytest.raises(SystemExit):
        cli("fit", "--config", str(workdir / "dumped.yaml"), "--print_config")
    again = capsys.readouterr().out
    assert yaml.safe_load(again) == yaml.safe_load(dumped)
    assert yaml.safe_load(dumped)["model"]["init_args"]["net"]["init_args"]["dropout"] == 0.3


def test_later_config_wins(cli, workdir: Path) -> None:
    (workdir / "override.yaml").write_text(
        "data:\n  batch_size: 17\nmodel:\n  init_args:\n    net:\n      init_args:\n        dropout: 0.4\n"
    )
    run = main(["--config", str(CONFIGS / "digits.yaml"), "--config", "override.yaml"], run=False)
    assert run.datamodule.hparams.batch_size == 17
    assert run.model.hparams.net["init_args"]["dropout"] == 0.4
    # the later file changed one of the net's arguments and kept the others digits.yaml gives
    assert run.model.hparams.net["init_args"]["hidden_sizes"] == [256, 128]
    assert [m.p for m in run.model.net.modules() if isinstance(m, torch.nn.Dropout)] == [0.4, 0.4]


SMALL = ["--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=300", *ONE_PASS]


def callback_types(*words: str) -> list[str]:
    """The classes of the built Trainer's callbacks, in order, without those Lightning adds itself."""
    run = main([*SMALL, *words, *QUIET], run=False)
    own = [c for c in run.trainer.callbacks if type(c).__module__.startswith(("src.", "lightning"))]
    return [type(c).__name__ for c in own if type(c).__name__ not in ("ModelSummary", "TQDMProgressBar")]


def named_class(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def shipped() -> list[str]:
    """What :func:`callback_types` finds with every section of configs/defaults.yaml on, read from the file:
    each section's class in the file's order, without the bar and the summary (QUIET turns them off, and
    Lightning's stand-ins are left out above), the CLI's config saver, then the checkpoint callbacks, which
    Lightning moves last in their order."""
    defaults = yaml.safe_load(DEFAULTS.read_text())
    classes = [named_class(defaults[s]["class_path"]) for s in callback_sections() if defaults[s] is not None]
    kept = [c for c in classes if not issubclass(c, ProgressBar | ModelSummary)]
    checkpoints = [c.__name__ for c in kept if issubclass(c, ModelCheckpoint)]
    return [*(c.__name__ for c in kept if not issubclass(c, ModelCheckpoint)), "SaveConfig", *checkpoints]


SHIPPED = shipped()
#: the core's own sections among them: what every run gets, plug-ins or none
CORE = ["EarlyStopping", "PredictionWriter", "SaveConfig", "ModelCheckpoint", "LatestCheckpoint"]


def test_defaults_give_each_shipped_callback_a_section_of_its_own(workdir: Path) -> None:
    defaults = yaml.safe_load(DEFAULTS.read_text())
    assert [key for key in defaults if key not in ("seed_everything", "trainer", "data")] == [
        *callback_sections()
    ]
    assert defaults["trainer"]["callbacks"] == []  # the user's own
    assert callback_types() == SHIPPED
    assert [name for name in SHIPPED if name in CORE] == CORE


def test_a_callback_section_changes_one_setting_or_switches_it_off(workdir: Path) -> None:
    run = main([*SMALL, "--early_stopping.patience=3", *QUIET], run=False)
    assert run.trainer.early_stopping_callback.patience == 3
    assert run.trainer.early_stopping_callback.monitor == "val/loss"  # the rest as in defaults.yaml
    (workdir / "off.yaml").write_text("early_stopping: null\nprediction_writer: null\n")
    expected = [name for name in SHIPPED if name not in ("EarlyStopping", "PredictionWriter")]
    assert len(expected) == len(SHIPPED) - 2
    assert callback_types("--config", "off.yaml") == expected
    assert callback_types("--early_stopping=null", "--prediction_writer=null") == expected


def test_own_callbacks_come_after_the_shipped_ones(workdir: Path) -> None:
    saver = SHIPPED.index("SaveConfig")
    own = [*SHIPPED[:saver], "LearningRateMonitor", *SHIPPED[saver:]]  # before the CLI's config saver
    assert callback_types("--trainer.callbacks+=lightning.pytorch.callbacks.LearningRateMonitor") == own
    own_callback = "    - class_path: lightning.pytorch.callbacks.LearningRateMonitor\n"
    (workdir / "own.yaml").write_text("trainer:\n  callbacks:\n" + own_callback)
    assert callback_types("--config", "own.yaml") == own  # a list of one's own replaces no shipped one


def test_bare_leaves_no_shipped_callback(workdir: Path) -> None:
    bare = yaml.safe_load((CONFIGS / "trainer" / "bare.yaml").read_text())
    assert bare == dict.fromkeys(callback_sections())
    # Lightning's own default ModelCheckpoint stands in while trainer.enable_checkpointing is left on
    assert callback_types(*BARE) == ["SaveConfig", "ModelCheckpoint"]
    assert callback_types(*BARE, "--trainer.enable_checkpointing=false") == ["SaveConfig"]


def test_enable_checkpointing_false_leaves_out_the_checkpoint_sections(cli, workdir: Path) -> None:
    """Lightning refuses a ModelCheckpoint beside enable_checkpointing=false; the shipped ones step aside."""
    run = cli("fit", *SMALL, *TINY, "--trainer.enable_checkpointing=false")
    assert run.trainer.state.finished
    assert run.trainer.checkpoint_callbacks == []
    assert not list(workdir.rglob("*.ckpt"))
    names = [type(c).__name__ for c in run.trainer.callbacks]
    # nor is predict's writer called at every step of fit
    kept = [n for n in SHIPPED if n not in ("ModelCheckpoint", "LatestCheckpoint", "PredictionWriter")]
    assert kept == [n for n in names if n in SHIPPED]


def test_shapes_are_linked_from_the_data(cli) -> None:
    run = main(["--config", str(CONFIGS / "diabetes.yaml")], run=False)
    assert (run.model.hparams.in_features, run.model.hparams.out_features) == (10, 1)


def test_one_cycle_gets_the_runs_step_count(cli) -> None:
    run = cli("fit", "--config", "friedman.yaml", "--data.num_samples=400", *TINY)
    scheduler = run.trainer.lr_scheduler_configs[0]
    assert scheduler.interval == "step"
    assert scheduler.scheduler.total_steps == run.trainer.estimated_stepping_batches == 6


def test_plateau_scheduler_watches_its_metric(cli) -> None:
    run = cli("fit", "--config", "diabetes.yaml", *TINY)
    config = run.trainer.lr_scheduler_configs[0]
    assert isinstance(config.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    assert config.monitor == "val/loss"
    assert config.interval == "epoch"


@pytest.mark.slow
@pytest.mark.parametrize("config", EXPERIMENTS, ids=lambda p: p.name)
def test_the_optimizer_gets_exactly_the_arguments_its_config_names(config: Path, cli) -> None:
    """No argument of another optimizer class (say AdamW's weight_decay) leaks into the one configured."""
    written = yaml.safe_load(config.read_text())["model"]["init_args"]["optimizer"]
    module_name, _, class_name = written["class_path"].rpartition(".")
    optimizer_class = getattr(importlib.import_module(module_name), class_name)
    param = [torch.nn.Parameter(torch.zeros(1))]
    optimizer = main(["--config", str(config)], run=False).model.optimizer(param)
    assert type(optimizer) is optimizer_class
    assert optimizer.defaults == optimizer_class(param, **written.get("init_args", {})).defaults


def test_the_optimizer_is_set_in_one_place_only(cli, capsys) -> None:
    """Top-level --optimizer/--lr_scheduler would silently replace the model's injected ones."""
    with pytest.raises(SystemExit):
        cli("fit", "--help")
    help_text = capsys.readouterr().out
    assert "--data.help" in help_text  # the help was printed
    assert "--optimizer " not in help_text
    assert "--lr_scheduler " not in help_text


def test_a_command_builds_the_parser_of_its_subcommand_and_help_lists_all(cli, capsys) -> None:
    """Each subcommand's parser holds every section's arguments: a command builds the one it runs."""
    run = cli("validate", "--config", "digits.yaml", *BARE, "--trainer.limit_val_batches=1")
    assert list(run.subcommands()) == ["validate"]
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    assert all(f"    {name} " in listed for name in ("fit", "validate", "test", "predict"))
    with pytest.raises(SystemExit):
        main(["fitt", "--config", str(CONFIGS / "digits.yaml")])
    assert "choose from 'fit', 'validate', 'test', 'predict'" in capsys.readouterr().err


@pytest.mark.slow
def test_an_ordinary_run_prints_no_notices_of_the_dependencies_about_themselves(tmp_path: Path) -> None:
    """As a user runs it, in a process of its own: no torch deprecation notice, no advertisement."""
    done = subprocess.run(
        [sys.executable, "-m", "src.cli", "fit", "--config", str(CONFIGS / "spiral.yaml"),
         "--data.num_samples=300", "--trainer.max_epochs=1", "--trainer.enable_progress_bar=false"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    printed = done.stdout + done.stderr
    assert "Fit ended: reached trainer.max_epochs=1" in printed  # the run's own messages still show
    assert "LeafSpec" not in printed
    assert "Tip" not in printed


def test_max_steps_may_end_the_run_inside_an_epoch(cli) -> None:
    # the shipped early stopping waits for a validation instead of asking for val/loss at the cut
    run = cli("fit", *SMALL, "--trainer.max_steps=3")
    assert run.trainer.global_step == 3
    assert run.trainer.state.finished


def test_a_run_without_a_logger_leaves_the_working_folders_config_yaml_alone(cli, workdir: Path) -> None:
    """Lightning writes config.yaml into the log folder, which without a logger is the working folder."""
    (workdir / "config.yaml").write_text("mine: true\n")
    cli("fit", "--config", "spiral.yaml", *TINY, "--trainer.logger=false")
    cli("predict", "--config", "spiral.yaml", "--data.num_samples=600", "--trainer.logger=false")
    assert (workdir / "config.yaml").read_text() == "mine: true\n"


class BestOfMine(ModelCheckpoint):
    """A user's subclass of the checkpoint callback: it takes its base's arguments."""


def test_a_class_switch_keeps_the_arguments_the_new_class_shares_and_print_config_shows_them(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """jsonargparse's rule, kept on purpose by its maintainers: a later ``class_path`` changes the class
    and keeps the arguments the new class shares; ``--print_config`` shows what runs."""
    digits = ["--config", str(CONFIGS / "digits.yaml")]  # AdamW: lr 0.002, weight_decay 0.0001
    (workdir / "sgd.yaml").write_text(
        "model:\n  init_args:\n    optimizer:\n      class_path: torch.optim.SGD\n      init_args:\n"
        "        momentum: 0.9\n"
    )
    for words in (
        ["--config", "sgd.yaml"],
        ["--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.init_args.momentum=0.9"],
    ):
        with pytest.raises(SystemExit):
            main(["fit", *digits, *words, "--print_config"])
        printed = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["optimizer"]
        run = main([*digits, *words, *QUIET], run=False)
        sgd = run.model.optimizer(run.model.parameters())
        group = sgd.param_groups[0]
        assert type(sgd) is torch.optim.SGD
        assert (group["lr"], group["weight_decay"], group["momentum"]) == (0.002, 0.0001, 0.9)
        assert printed["class_path"] == "torch.optim.SGD"
        assert {key: printed["init_args"][key] for key in ("lr", "weight_decay", "momentum")} == {
            "lr": 0.002,
            "weight_decay": 0.0001,
            "momentum": 0.9,
        }
    # a subclass takes its base's arguments, as defaults.yaml gives them
    run = main([*digits, f"--best_checkpoint={__name__}.BestOfMine", *QUIET], run=False)
    mine = next(c for c in run.trainer.callbacks if isinstance(c, BestOfMine))
    assert (mine.monitor, mine.filename) == ("val/loss", "best-epoch{epoch:03d}-step{step}")


def test_the_sections_make_train_turns_on_add_at_most_six_callbacks_to_the_cores(workdir: Path) -> None:
    """Beyond the core's own callbacks and those that stand in for Lightning's bar and model summary, every
    section of configs/defaults.yaml is one more call at every hook of every step: sections that travel
    together are one callback."""
    run = main(["--config", str(CONFIGS / "digits.yaml")], run=False)
    built = [type(c).__name__ for c in run.trainer.callbacks if not isinstance(c, ProgressBar | ModelSummary)]
    added = [name for name in built if name not in CORE]
    assert added == [name for name in SHIPPED if name not in CORE]  # one callback per section, in its order
    assert len(added) <= 6
