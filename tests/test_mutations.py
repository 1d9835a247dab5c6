"""Break the code on purpose, one change at a time, and expect the test that proves the claim to fail.

A proof that still passes with the behaviour it proves taken out proves nothing: a norm-clipping
threshold that is never reached, a best epoch that is also the last. Each check here applies one
breakage in-process, for the duration of the check only (:func:`mutate`: a copy of one project function
with one piece of its source replaced, monkeypatched over the original), runs the proof of the claim,
and expects an ``AssertionError`` from it. ``tests/README.md`` describes the procedure and holds the
table of breakages and the tests that catch them.
"""

import inspect
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

import examples.loop
import examples.test_loop as loop
import examples.test_parity as parity
import src.checkpoints
import src.cli_errors
import src.files
import src.models.base
import src.models.schedules
import src.predict
import tests.test_accumulation_clipping as accumulation_clipping
import tests.test_best_checkpoint as best_checkpoint
import tests.test_checkpointing as checkpointing
import tests.test_errors as errors
import tests.test_predict as predict
import tests.test_schedules as schedules
import tests.test_trust as trust
from examples.manual import ManualClassifier
from src.callbacks import PredictionWriter
from src.cli import CLI
from src.models import BaseTask
from src.predict import Predictor
from tests.helpers import LABEL_NAMES

NORM_CASE = parity.CASES["accumulate3-clip-norm-step-scheduler"]
VALUE_CASE = parity.CASES["accumulate2-clip-value-epoch-scheduler-batchnorm"]


def replace_once(text: str, old: str, new: str, where: str) -> str:
    assert text.count(old) == 1, f"{where} no longer holds {old!r} exactly once: update the mutation"
    return text.replace(old, new)


def mutate(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, old: str, new: str) -> None:
    """Replace ``owner.<name>``, a function of a module or class, by a copy with ``old`` replaced by ``new``.

    ``old`` must occur exactly once in the function's source: when the code changes so that it no longer
    does, this fails loudly instead of running the proof against an unbroken copy.
    """
    original = vars(owner)[name]  # defined by owner itself, not inherited
    source = replace_once(textwrap.dedent(inspect.getsource(original)), old, new, where=name)
    module = sys.modules[original.__module__]
    # compiled inside a class body, so that a zero-argument super() finds its __class__ cell, which is
    # then pointed at the real owner; the module's globals resolve every other name as in the original
    body = textwrap.indent(source, "    ")
    namespace: dict[str, type] = {}
    exec(compile(f"class Mutant:\n{body}", inspect.getsourcefile(original), "exec"), vars(module), namespace)
    mutant = vars(namespace["Mutant"])[name]
    for variable, cell in zip(mutant.__code__.co_freevars, mutant.__closure__ or (), strict=True):
        if variable == "__class__":
            cell.cell_contents = owner
    monkeypatch.setattr(owner, name, mutant)


def test_mutate_replaces_the_function_for_the_check_only(monkeypatch: pytest.MonkeyPatch) -> None:
    original = ManualClassifier.training_step
    mutate(monkeypatch, ManualClassifier, "training_step", "self.manual_backward(loss / k)", "pass")
    assert ManualClassifier.training_step is not original
    assert "manual_backward" not in ManualClassifier.training_step.__code__.co_names
    monkeypatch.undo()
    assert ManualClassifier.training_step is original
    with pytest.raises(AssertionError, match="no longer holds"):
        mutate(monkeypatch, ManualClassifier, "training_step", "a line that is not there", "pass")


# -- clipping by norm -------------------------------------------------------------------------------


def test_parity_catches_a_manual_module_that_does_not_clip_by_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    mutate(
        monkeypatch,
        ManualClassifier,
        "on_before_optimizer_step",
        'self.hparams["gradient_clip_val"],',
        'self.hparams["gradient_clip_val"] if self.hparams["gradient_clip_algorithm"] == "value" else None,',
    )
    with pytest.raises(AssertionError, match="not equal"):
        parity.test_raw_loop_equals_manual_module_equals_automatic_module(NORM_CASE)


def test_parity_and_loop_tests_catch_a_raw_loop_that_does_not_clip_by_norm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mutate(
        monkeypatch,
        examples.loop,
        "train_epoch",
        "torch.nn.utils.clip_grad_norm_(net.parameters(), gradient_clip_val)",
        "pass",
    )
    with pytest.raises(AssertionError):  # clipping never ran in the raw loop: the precondition fails
        parity.test_raw_loop_equals_manual_module_equals_automatic_module(NORM_CASE)
    with pytest.raises(AssertionError, match="not close"):
        loop.test_clipping_by_norm_limits_the_update_of_each_step()


def test_clipping_test_catches_a_trainer_path_that_does_not_clip(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a task whose configure_gradient_clipping forgets to call clip_gradients: Lightning then clips nothing
    monkeypatch.setattr(
        BaseTask, "configure_gradient_clipping", lambda self, *args, **kwargs: None, raising=False
    )
    with pytest.raises(AssertionError):
        accumulation_clipping.test_norm_clipping_bounds_the_global_norm_the_optimizer_uses(workdir)


# -- clipping by value ------------------------------------------------------------------------------


def test_parity_catches_a_manual_module_that_clips_by_norm_when_told_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mutate(
        monkeypatch,
        ManualClassifier,
        "on_before_optimizer_step",
        'self.hparams["gradient_clip_algorithm"]',
        '"norm"',
    )
    with pytest.raises(AssertionError, match="not equal"):
        parity.test_raw_loop_equals_manual_module_equals_automatic_module(VALUE_CASE)


def test_parity_and_loop_tests_catch_a_raw_loop_that_clips_by_norm_when_told_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mutate(monkeypatch, examples.loop, "train_epoch", 'gradient_clip_algorithm == "value"', "False")
    with pytest.raises(AssertionError, match="not equal"):
        parity.test_raw_loop_equals_manual_module_equals_automatic_module(VALUE_CASE)
    with pytest.raises(AssertionError, match="not close"):
        loop.test_clipping_by_value_bounds_every_gradient_element()


# -- accumulation -----------------------------------------------------------------------------------


def test_parity_and_loop_tests_catch_a_raw_loop_that_averages_the_short_last_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # each loss divided by its group's length (1 for the 7th of 7 batches at k=2), not by k
    group_length = "min(k, num_batches - batch_idx + batch_idx % k)"
    mutate(
        monkeypatch,
        examples.loop,
        "train_epoch",
        "(loss / k).backward()",
        f"(loss / {group_length}).backward()",
    )
    with pytest.raises(AssertionError, match="not equal"):
        parity.test_raw_loop_equals_manual_module_equals_automatic_module(VALUE_CASE)
    with pytest.raises(AssertionError, match="not close"):
        loop.test_last_partial_group_steps_with_its_losses_divided_by_k_as_lightning_does()


def test_loop_tests_catch_a_raw_loop_that_zeroes_gradients_every_micro_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mutate(monkeypatch, examples.loop, "train_epoch", "if first_in_group:", "if True:")
    with pytest.raises(AssertionError, match="not close"):
        loop.test_accumulating_four_micro_batches_equals_one_batch_four_times_larger()


def test_parity_catches_a_manual_module_that_does_not_divide_by_k(monkeypatch: pytest.MonkeyPatch) -> None:
    mutate(
        monkeypatch,
        ManualClassifier,
        "training_step",
        "self.manual_backward(loss / k)",
        "self.manual_backward(loss)",
    )
    with pytest.raises(AssertionError, match="not equal"):
        parity.test_raw_loop_equals_manual_module_equals_automatic_module(NORM_CASE)


def test_parity_catches_a_manual_module_that_drops_the_short_last_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mutate(monkeypatch, ManualClassifier, "training_step", "% k == 0 or last_of_epoch:", "% k == 0:")
    with pytest.raises(AssertionError, match="not equal"):
        parity.test_raw_loop_equals_manual_module_equals_automatic_module(NORM_CASE)


def test_accumulation_test_catches_a_loss_divided_by_k_twice(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lightning already divides the returned loss by accumulate_grad_batches; dividing it again is the slip
    mutate(
        monkeypatch,
        BaseTask,
        "training_step",
        'return self._shared_step(batch, self.train_loss, self.train_metrics)["loss"]',
        'return self._shared_step(batch, self.train_loss, self.train_metrics)["loss"]'
        " / self.trainer.accumulate_grad_batches",
    )
    with pytest.raises(AssertionError, match="not close"):
        accumulation_clipping.test_accumulating_k_batches_equals_one_batch_k_times_bigger(workdir)


# -- schedulers -------------------------------------------------------------------------------------


def test_parity_catches_a_manual_module_that_steps_an_epoch_scheduler_every_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mutate(
        monkeypatch,
        ManualClassifier,
        "_step_scheduler",
        'if self.hparams["scheduler_interval"] == interval:',
        "if True:",
    )
    with pytest.raises(AssertionError, match="not equal"):
        parity.test_raw_loop_equals_manual_module_equals_automatic_module(VALUE_CASE)


def test_parity_catches_a_module_that_ignores_scheduler_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    mutate(
        monkeypatch,
        BaseTask,
        "configure_optimizers",
        'config = {"scheduler": scheduler, "interval": interval}',
        'config = {"scheduler": scheduler, "interval": "step"}',
    )
    with pytest.raises(AssertionError, match="not equal"):
        parity.test_raw_loop_equals_manual_module_equals_automatic_module(VALUE_CASE)


def test_parity_catches_a_manual_module_that_never_steps_a_plateau_scheduler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mutate(
        monkeypatch,
        ManualClassifier,
        "on_train_epoch_end",
        "scheduler.step(self.trainer.callback_metrics[monitor])",
        "pass",
    )
    with pytest.raises(AssertionError, match="not equal"):
        parity.test_raw_loop_equals_manual_module_equals_automatic_module(parity.CASES["plateau"])


# -- precision --------------------------------------------------------------------------------------


def test_parity_catches_a_raw_loop_that_ignores_bf16_mixed(monkeypatch: pytest.MonkeyPatch) -> None:
    mutate(monkeypatch, examples.loop, "_autocast", 'enabled=precision == "bf16-mixed"', "enabled=False")
    with pytest.raises(AssertionError, match="not equal"):
        parity.test_raw_loop_equals_manual_module_equals_automatic_module(
            parity.CASES["bf16-mixed-accumulate3-clip-norm"]
        )


# -- the best checkpoint and last.ckpt --------------------------------------------------------------


def test_best_checkpoint_test_catches_testing_the_last_weights(
    cli, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the line that names the best checkpoint is still printed; only the weights tested change
    mutate(monkeypatch, CLI, "after_fit", "ckpt_path=best or None", "ckpt_path=None")
    with pytest.raises(AssertionError, match="not equal"):
        best_checkpoint.test_after_fit_runs_the_best_checkpoints_weights_not_the_last(
            cli, monkeypatch, capsys
        )


# the resume proof's own filter: its second run writes into the folder it resumes from
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty:UserWarning")
def test_checkpoint_tests_catch_a_last_ckpt_written_only_beside_a_best_one(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The trap defaults.yaml warns of: ``save_last`` on the best-k callback, no callback of its own."""
    fragment = checkpointing.TRAINER / "checkpoints.yaml"
    saves_last = "    save_top_k: 3\n    save_last: true\n"
    text = replace_once(fragment.read_text(), "    save_top_k: 3\n", saves_last, where=fragment.name)
    text += "last_checkpoint: null\n"  # last.ckpt only from save_last
    (tmp_path / "mutant").mkdir()
    (tmp_path / "mutant" / fragment.name).write_text(text)
    monkeypatch.setattr(checkpointing, "TRAINER", tmp_path / "mutant")
    # resumed from epoch 2, the last best one, with an older optimizer state than where the run stopped
    with pytest.raises(AssertionError, match="not equal"):
        checkpointing.test_fit_ckpt_path_last_resumes_optimizer_and_scheduler_state(workdir)
    # no callback of last.ckpt's own: the proof finds none (and last.ckpt holds epoch 4, the last to
    # enter the 3 best, not the last epoch)
    with pytest.raises(IndexError):
        checkpointing.test_early_stopping_waits_patience_epochs_and_checkpoints_keep_the_best(workdir)


def test_predictions_catch_lines_shifted_against_the_rows_they_name(
    monkeypatch: pytest.MonkeyPatch, cli, tmp_path: Path
) -> None:
    mutate(
        monkeypatch,
        PredictionWriter,
        "write_on_epoch_end",
        "rows = every[positions]",
        "rows = np.roll(every[positions], 1)",
    )
    fit = cli("fit", "--config", "spiral.yaml", "--data.num_samples=300", "--trainer.max_epochs=1")
    checkpoint = Path(fit.trainer.log_dir) / "checkpoints" / "last.ckpt"
    output = tmp_path / "out.csv"
    cli("predict", "--ckpt_path", str(checkpoint), f"--output={output}")
    predictor = Predictor.from_checkpoint(checkpoint)
    source = pd.DataFrame(fit.datamodule.x, columns=fit.datamodule.columns)  # (N, 2): every row drawn
    with pytest.raises(AssertionError, match="Not equal"):
        predict.lines_name_their_rows(pd.read_csv(output), source, predictor)


def test_trust_catches_a_walk_that_stops_at_the_top_level(
    trained, planted: Path, workdir: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check of the names a checkpoint carries at its top level only: a nested class path gets in."""
    mutate(
        monkeypatch,
        src.checkpoints,
        "names_of_code",
        "                yield from names_of_code(item, inner)",
        "                yield from names_of_code(item, inner) if not where else ()",
    )
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        trust.assert_names_no_code(
            trust.entry_points(workdir)["Predictor"], trained, planted, workdir, capsys, "deep in a list"
        )


def test_trust_catches_an_output_check_that_forgets_the_inputs(
    trained, workdir: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked to overwrite, the check lets an output land on the checkpoint the run reads."""
    original = src.files.check_output
    mutate(
        monkeypatch,
        src.files,
        "check_output",
        "for given in _flat(inputs):",
        "for given in _flat(()):",
    )
    for module in list(sys.modules.values()):  # the modules that imported the original by name
        if getattr(module, "check_output", None) is original:
            monkeypatch.setattr(module, "check_output", src.files.check_output)
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        trust.test_no_output_lands_on_an_input_even_when_overwriting(
            trained, workdir, capsys, "the checkpoint", True
        )


def test_predict_catches_an_output_check_that_looks_only_at_an_input_folder_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The check compares an output with a folder, not with the files in it."""
    original = src.files.check_output
    mutate(monkeypatch, src.files, "check_output", "if _inside(target, given):", "if False:")
    for module in list(sys.modules.values()):  # the modules that imported the original by name
        if getattr(module, "check_output", None) is original:
            monkeypatch.setattr(module, "check_output", src.files.check_output)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        predict.test_the_output_rule_covers_a_folder_the_run_reads_at_any_depth_and_through_links(tmp_path)


def test_k_target_predictions_catch_entries_numbered_although_the_data_names_them(
    monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    """A multi-label task's columns numbered preds(0) … although its DataModule names its K labels."""
    mutate(monkeypatch, src.predict, "_names", "len(labels) == k", "len(labels) == -k")
    with pytest.raises(AssertionError):
        predict.test_a_users_k_target_task_predicts_a_column_per_entry_named_by_the_datas_names(
            cli, "labels", LABEL_NAMES
        )


def test_k_target_predictions_catch_a_task_whose_own_choice_is_replaced_by_a_class_label(
    monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    """(N, K) 0/1 choices read as if they were the shipped classifier's (N,) class ids."""
    original = src.predict.prediction_frame
    mutate(monkeypatch, src.predict, "prediction_frame", "(preds is None or preds.ndim == 1)", "True")
    for module in list(sys.modules.values()):  # the modules that imported the original by name
        if getattr(module, "prediction_frame", None) is original:
            monkeypatch.setattr(module, "prediction_frame", src.predict.prediction_frame)
    with pytest.raises(ValueError, match="must each be 1-dimensional"):  # pandas refuses the (N, K) labels
        predict.test_a_users_k_target_task_predicts_a_column_per_entry_named_by_the_datas_names(
            cli, "labels", LABEL_NAMES
        )


def test_the_momentum_notice_test_catches_a_notice_that_names_the_schedulers_value(
    monkeypatch: pytest.MonkeyPatch, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The notice names the momentum the scheduler wrote (0.95), not the one the config gave (0.7)."""
    original = src.models.schedules.check_replaced
    mutate(monkeypatch, src.models.schedules, "check_replaced", "(old[key], key)", "(group[key], key)")
    monkeypatch.setattr(src.models.base, "check_replaced", src.models.schedules.check_replaced)
    assert src.models.base.check_replaced is not original
    case = schedules.test_a_scheduler_that_replaces_the_optimizers_momentum_says_so_once
    with pytest.raises(AssertionError):
        case(workdir, caplog, [*schedules.SGD, *schedules.ONE_CYCLE], "OneCycleLR cycles the optimizer's "
             "momentum between 0.85 and 0.95 and replaces momentum=0.7; give cycle_momentum: false to keep "
             "it.", 0.95)  # fmt: skip


def test_the_moved_option_test_catches_a_refusal_that_knows_only_the_bare_option(
    monkeypatch: pytest.MonkeyPatch, cli, capsys
) -> None:
    """--optimizer=SGD and --optimizer.lr=0.1 left to the bare "unrecognized arguments"."""
    mutate(monkeypatch, src.cli_errors, "moved_option", 're.match(rf"{o}(?=$|[=.])", word)', "o == word")
    with pytest.raises(AssertionError):
        errors.test_lightnings_own_optimizer_options_point_to_the_models_arguments(
            cli, capsys, ["--optimizer.lr=0.1"], "--model.init_args.optimizer.lr=0.1", None
        )
