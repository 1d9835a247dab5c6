"""The tasks' steps, losses, metrics and predictions, checked against direct computations."""

import functools
import inspect
from pathlib import Path
from typing import Any

import docstring_parser
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import f1_score, mean_absolute_error, r2_score

from src.cli import main
from src.models import BaseTask, Classifier, ManualClassifier, Regressor
from src.nets import MLP

# these tests call the steps directly, without a Trainer, so self.log() has nowhere to go and says so
pytestmark = pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`:UserWarning")


def test_mlp_registers_every_layer_and_shapes() -> None:
    net = MLP(5, 3, hidden_sizes=[8, 4], dropout=0.1, batch_norm=True)
    # 5*8 (no bias before BatchNorm) + 2*8 BN, 8*4 + 2*4 BN, head 4*3+3
    assert sum(p.numel() for p in net.parameters()) == 40 + 16 + 32 + 8 + 15
    assert net(torch.randn(7, 5)).shape == (7, 3)
    assert sum(isinstance(m, torch.nn.Dropout) for m in net.modules()) == 2
    assert MLP(5, 1, hidden_sizes=[]).head.in_features == 5
    with pytest.raises(ValueError, match="activation 'swish' is unknown"):
        MLP(5, 1, activation="swish")


def test_classifier_loss_is_cross_entropy_of_raw_logits() -> None:
    torch.manual_seed(0)
    model = Classifier(in_features=4, out_features=3, hidden_sizes=[8], label_smoothing=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    loss = model.training_step((x, y), 0)
    logits = model.net(x)
    torch.testing.assert_close(loss, F.cross_entropy(logits, y, label_smoothing=0.1))
    # softmaxing first would be a different (and wrong) number
    assert not torch.allclose(loss, F.cross_entropy(logits.softmax(-1), y, label_smoothing=0.1))


def test_classifier_class_weights_enter_the_loss() -> None:
    model = Classifier(in_features=4, out_features=3, hidden_sizes=[8], class_weights=True)
    model.class_weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    expected = F.cross_entropy(model.net(x), y, weight=torch.tensor([1.0, 2.0, 0.5]))
    torch.testing.assert_close(model.loss(model.net(x), y), expected)


def test_classifier_epoch_metrics_match_sklearn() -> None:
    torch.manual_seed(0)
    model = Classifier(in_features=4, out_features=3, hidden_sizes=[8])
    batches = [(torch.randn(10, 4), torch.randint(0, 3, (10,))) for _ in range(3)]
    preds, targets = [], []
    for x, y in batches:
        model.test_step((x, y), 0)
        preds.append(model.net(x).argmax(-1))
        targets.append(y)
    p, t = torch.cat(preds).numpy(), torch.cat(targets).numpy()
    computed = model.test_metrics.compute()
    assert computed["test/acc"].item() == pytest.approx((p == t).mean())
    assert computed["test/f1"].item() == pytest.approx(f1_score(t, p, average="macro", labels=[0, 1, 2]))
    assert model.test_loss.compute().item() == pytest.approx(
        np.mean([F.cross_entropy(model.net(x), y).item() for x, y in batches]), rel=1e-5
    )


def test_classifier_predicts_probabilities_and_labels() -> None:
    model = Classifier(in_features=4, out_features=3, hidden_sizes=[8]).eval()
    out = model.predict_step((torch.randn(6, 4), torch.zeros(6)), 0)
    torch.testing.assert_close(out["probs"].sum(-1), torch.ones(6))
    torch.testing.assert_close(out["preds"], out["probs"].argmax(-1))


@pytest.mark.parametrize("loss_fn", ["mse", "huber"])
def test_regressor_trains_on_standardized_targets_and_reports_original_units(loss_fn: str) -> None:
    torch.manual_seed(0)
    model = Regressor(in_features=3, out_features=1, hidden_sizes=[8], loss_fn=loss_fn, huber_delta=0.5)
    model.target_mean.fill_(100.0)
    model.target_std.fill_(20.0)
    x, y = torch.randn(12, 3), 100 + 20 * torch.randn(12)
    out = model.net(x)  # (B, 1), standardized units
    expected_loss = (
        F.mse_loss(out.squeeze(-1), (y - 100) / 20)
        if loss_fn == "mse"
        else F.huber_loss(out.squeeze(-1), (y - 100) / 20, delta=0.5)
    )
    torch.testing.assert_close(model.training_step((x, y), 0), expected_loss)
    preds = model.predict_step((x,), 0)["preds"]
    torch.testing.assert_close(preds, out.squeeze(-1) * 20 + 100)
    model.test_step((x, y), 0)
    m = model.test_metrics.compute()
    p, t = preds.detach().numpy(), y.numpy()
    assert m["test/mae"].item() == pytest.approx(mean_absolute_error(t, p), rel=1e-5)
    assert m["test/rmse"].item() == pytest.approx(np.sqrt(np.mean((t - p) ** 2)), rel=1e-5)
    assert m["test/r2"].item() == pytest.approx(r2_score(t, p), rel=1e-4)


def test_hyperparameters_are_primitives() -> None:
    model = Classifier(in_features=4, out_features=3, hidden_sizes=[8], label_smoothing=0.1)
    assert dict(model.hparams) == {
        "in_features": 4,
        "out_features": 3,
        "hidden_sizes": [8],
        "activation": "relu",
        "dropout": 0.0,
        "batch_norm": False,
        "scheduler_interval": "epoch",
        "scheduler_monitor": "val/loss",
        "compile_net": False,
        "activation_checkpointing": False,
        "label_smoothing": 0.1,
        "class_weights": False,
    }


# -- the subclasses' signatures: BaseTask's arguments written out, so the CLI and --help can read them --

TASKS = [Classifier, Regressor, ManualClassifier]


def base_parameters() -> list[inspect.Parameter]:
    return list(inspect.signature(BaseTask).parameters.values())


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.__name__)
def test_subclass_signature_repeats_every_base_task_argument(task: type[BaseTask]) -> None:
    own = list(inspect.signature(task).parameters.values())
    base = base_parameters()
    # same names, order, kind (positional or keyword), default and annotation
    assert own[: len(base)] == base
    # what the subclass adds comes after, keyword-only, so positional calls mean what they meant
    assert own[len(base) :]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in own[len(base) :])
    assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in own)


def non_default_base_arguments(out_features: int) -> dict[str, Any]:
    return {
        "in_features": 5,
        "out_features": out_features,
        "hidden_sizes": [7],
        "activation": "tanh",
        "dropout": 0.25,
        "batch_norm": True,
        "optimizer": functools.partial(torch.optim.SGD, lr=0.1),
        "scheduler": functools.partial(torch.optim.lr_scheduler.StepLR, step_size=2),
        "scheduler_interval": "step",
        "scheduler_monitor": "val/acc",
        "compile_net": True,
        "activation_checkpointing": True,
    }


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.__name__)
def test_subclass_hands_every_base_task_argument_on(task: type[BaseTask], monkeypatch) -> None:
    """A value given to the subclass reaches BaseTask, not its default.

    Checked at BaseTask's door: the saved hyperparameters would not notice a dropped argument, since
    save_hyperparameters also reads the subclass's own frame.
    """
    arguments = non_default_base_arguments(out_features=1 if task is Regressor else 3)
    defaults = {p.name: p.default for p in base_parameters()}
    assert arguments.keys() == defaults.keys()
    assert all(arguments[name] != defaults[name] for name in arguments)
    received: dict[str, Any] = {}
    real_init = BaseTask.__init__

    # wraps: save_hyperparameters reads BaseTask.__init__'s signature, which must stay the real one
    @functools.wraps(real_init)
    def spy(self: BaseTask, **kwargs: Any) -> None:  # keyword-only: a positional pass-on fails here
        received.update(kwargs)
        real_init(self, **kwargs)

    monkeypatch.setattr(BaseTask, "__init__", spy)
    task(**arguments)
    assert received == arguments


def documented_arguments(task: type[BaseTask]) -> dict[str, str]:
    """Each argument's description, the subclass's own over its bases' (as jsonargparse reads them)."""
    docs: dict[str, str] = {}
    for cls in reversed(task.__mro__[: task.__mro__.index(BaseTask) + 1]):
        # parse() raises on a malformed Args section, which would otherwise drop every description
        parsed = docstring_parser.parse(cls.__doc__ or "", style=docstring_parser.DocstringStyle.GOOGLE)
        docs.update({p.arg_name: p.description or "" for p in parsed.params})
    return docs


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.__name__)
def test_help_describes_every_argument(task: type[BaseTask], capsys, workdir: Path) -> None:
    docs = documented_arguments(task)
    assert set(inspect.signature(task).parameters) <= {name for name, text in docs.items() if text}
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--model.help", f"{task.__module__}.{task.__name__}"])
    assert exit_.value.code == 0
    # argparse wraps lines (at hyphens too), so compare with all whitespace removed
    shown = "".join(capsys.readouterr().out.split())
    for name in inspect.signature(task).parameters:
        assert f"--model.{name}" in shown
        assert "".join(docs[name].split()) in shown, name


# -- BaseTask's required hooks are abstract: leaving one out fails at construction, not mid-training --

REQUIRED_HOOKS = ["build_metrics", "loss", "metric_inputs", "predict_step"]


def task_without(hook: str) -> type[BaseTask]:
    """A BaseTask subclass that defines every required hook except ``hook`` (borrowed from Classifier)."""
    body = {name: getattr(Classifier, name) for name in REQUIRED_HOOKS if name != hook}
    return type(f"No_{hook}", (BaseTask,), body)


def test_the_required_hooks_are_exactly_the_abstract_ones() -> None:
    assert BaseTask.__abstractmethods__ == frozenset(REQUIRED_HOOKS)
    assert not Classifier.__abstractmethods__
    assert not Regressor.__abstractmethods__
    assert not ManualClassifier.__abstractmethods__


@pytest.mark.parametrize("hook", REQUIRED_HOOKS)
def test_a_task_missing_a_required_hook_cannot_be_built(hook: str) -> None:
    task = task_without(hook)
    with pytest.raises(TypeError, match=f"abstract method '?{hook}'?"):
        task(in_features=4, out_features=3)
    # the same class with the hook put back builds: nothing else was missing
    type("Complete", (task,), {hook: getattr(Classifier, hook)})(in_features=4, out_features=3)


WithoutLoss = task_without("loss")  # importable, so the CLI can be pointed at it


def test_the_cli_refuses_a_task_missing_a_required_hook(cli, capsys) -> None:
    model = f"{__name__}.WithoutLoss"
    with pytest.raises(SystemExit) as exit_:
        cli("fit", "--config", "spiral.yaml", "--trainer.fast_dev_run=1", "--model", model)
    assert exit_.value.code != 0
    assert "Expected an instantiatable class, but is abstract" in capsys.readouterr().err
