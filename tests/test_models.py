"""The tasks' steps, losses, metrics and predictions, checked against direct computations."""

import functools
import inspect
import re
from pathlib import Path
from typing import Any

import docstring_parser
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import f1_score, mean_absolute_error, r2_score
from torch import nn

from examples.manual import ManualClassifier
from src.cli import main
from src.errors import UserInputError
from src.models import BaseTask, Classifier, Regressor
from src.nets import MLP
from tests.conftest import CONFIGS

# The steps are called here without a Trainer, to compare them with direct computations; Lightning
# warns that their self.log calls then log nothing, which is all these tests need.
pytestmark = pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`:UserWarning")


def mlp(*hidden_sizes: int, **kwargs: Any) -> functools.partial[MLP]:
    """The net factory a task is given in Python: ``net(in_features, out_features)`` builds the MLP."""
    return functools.partial(MLP, hidden_sizes=list(hidden_sizes), **kwargs)


def test_mlp_registers_every_layer_and_shapes() -> None:
    net = MLP(5, 3, hidden_sizes=[8, 4], dropout=0.1, batch_norm=True)
    # 5*8 (no bias before BatchNorm) + 2*8 BN, 8*4 + 2*4 BN, head 4*3+3
    assert sum(p.numel() for p in net.parameters()) == 40 + 16 + 32 + 8 + 15
    assert net(torch.randn(7, 5)).shape == (7, 3)
    assert sum(isinstance(m, torch.nn.Dropout) for m in net.modules()) == 2
    assert MLP(5, 1, hidden_sizes=[]).head.in_features == 5
    # plain PyTorch: ValueErrors naming the net, which a task turns into a sentence about its option
    with pytest.raises(ValueError, match=re.escape("MLP activation='swish' is unknown")):
        MLP(5, 1, activation="swish")
    with pytest.raises(ValueError, match=re.escape("MLP dropout=1.0 must lie in [0, 1).")):
        MLP(5, 1, dropout=1.0)


# -- the net is injected: any nn.Module built from the data's widths ------------------------------------


def test_the_net_is_built_by_the_factory_from_the_datas_widths() -> None:
    built: list[tuple[int, int]] = []

    def linear(in_features: int, out_features: int) -> nn.Module:
        built.append((in_features, out_features))
        return nn.Linear(in_features, out_features)

    model = Classifier(in_features=4, out_features=3, net=linear)
    assert built == [(4, 3)]  # called once, with the widths the task was given
    assert isinstance(model.net, nn.Linear)
    x = torch.randn(5, 4)
    torch.testing.assert_close(model(x), model.net(x))  # forward is the net's, nothing added
    # no net given: src.nets.DEFAULT_NET, a plain MLP of two hidden layers of 128
    default = Classifier(in_features=4, out_features=3).net
    assert isinstance(default, MLP)
    assert [m.out_features for m in default.modules() if isinstance(m, nn.Linear)] == [128, 128, 3]


def test_a_bad_net_argument_is_one_sentence_naming_the_option() -> None:
    with pytest.raises(
        UserInputError,
        match=re.escape("model.init_args.net: MLP hidden_sizes=[-1]: every width must be at least 1."),
    ):
        Classifier(in_features=4, out_features=3, net=mlp(-1))


# -- steps, losses, metrics, predictions ------------------------------------------------------------------


def test_classifier_loss_is_cross_entropy_of_raw_logits() -> None:
    torch.manual_seed(0)
    model = Classifier(in_features=4, out_features=3, net=mlp(8), label_smoothing=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    loss = model.training_step((x, y), 0)
    logits = model.net(x)
    torch.testing.assert_close(loss, F.cross_entropy(logits, y, label_smoothing=0.1))
    # softmaxing first would be a different (and wrong) number
    assert not torch.allclose(loss, F.cross_entropy(logits.softmax(-1), y, label_smoothing=0.1))


def test_classifier_class_weights_enter_the_loss() -> None:
    model = Classifier(in_features=4, out_features=3, net=mlp(8), class_weights=True)
    model.class_weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    expected = F.cross_entropy(model.net(x), y, weight=torch.tensor([1.0, 2.0, 0.5]))
    torch.testing.assert_close(model.loss(model.net(x), y), expected)


def test_classifier_epoch_metrics_match_sklearn() -> None:
    torch.manual_seed(0)
    model = Classifier(in_features=4, out_features=3, net=mlp(8))
    # batches of unequal size: the epoch loss weighs each batch by its rows
    batches = [(torch.randn(rows, 4), torch.randint(0, 3, (rows,))) for rows in (10, 7, 13)]
    for x, y in batches:
        model.test_step((x, y), 0)
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    with torch.no_grad():
        logits = model.net(x)
    p, t = logits.argmax(-1).numpy(), y.numpy()
    computed = model.test_metrics.compute()
    assert set(computed) == {"test/acc", "test/f1"}
    assert computed["test/acc"].item() == pytest.approx((p == t).mean())
    assert computed["test/f1"].item() == pytest.approx(f1_score(t, p, average="macro", labels=[0, 1, 2]))
    # the mean over batches weighted by rows: the mean over every row of the epoch
    assert model.test_loss.compute().item() == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-5)
    # the other stages saw nothing
    assert not model.train_loss.update_called
    assert not model.val_loss.update_called


def test_classifier_predicts_probabilities_and_labels() -> None:
    model = Classifier(in_features=4, out_features=3, net=mlp(8)).eval()
    out = model.predict_step((torch.randn(6, 4), torch.zeros(6)), 0)
    torch.testing.assert_close(out["probs"].sum(-1), torch.ones(6))
    torch.testing.assert_close(out["preds"], out["probs"].argmax(-1))


@pytest.mark.parametrize("loss_fn", ["mse", "huber"])
def test_regressor_trains_on_standardized_targets_and_reports_original_units(loss_fn: str) -> None:
    torch.manual_seed(0)
    model = Regressor(in_features=3, out_features=1, net=mlp(8), loss_fn=loss_fn, huber_delta=0.5)
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
    assert m["test/rmse"].item() == pytest.approx(((t - p) ** 2).mean() ** 0.5, rel=1e-5)
    assert m["test/r2"].item() == pytest.approx(r2_score(t, p), rel=1e-4)


# -- hyperparameters: primitives, so that checkpoints load with torch.load(weights_only=True) ----------

BASE_HPARAMS = {
    "scheduler_interval": "epoch",
    "scheduler_monitor": "val/loss",
    "compile_net": False,
    "target_names": None,  # one target
}


def test_hyperparameters_are_primitives_and_a_python_net_factory_is_left_out() -> None:
    model = Classifier(in_features=4, out_features=3, net=mlp(8), label_smoothing=0.1)
    # a factory built in Python is no primitive: left out (passed again to load_from_checkpoint)
    assert dict(model.hparams) == {
        "in_features": 4,
        "out_features": 3,
        **BASE_HPARAMS,
        "label_smoothing": 0.1,
        "class_weights": False,
    }
    # no net given: the default is saved as what it is
    assert Classifier(in_features=4, out_features=3).hparams["net"] is None


def is_primitive(value: object) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_primitive(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(is_primitive(v) for v in value)
    return value is None or isinstance(value, bool | int | float | str)


def test_a_net_named_in_yaml_is_saved_as_its_config(workdir: Path) -> None:
    run = main(["--config", str(CONFIGS / "spiral.yaml")], run=False)
    hparams = dict(run.model.hparams)
    # the config the checkpoint rebuilds the net from: class_path and every init argument
    assert hparams["net"] == {
        "class_path": "src.nets.MLP",
        "init_args": {
            "hidden_sizes": [64, 64],
            "activation": "tanh",
            "dropout": 0.0,
            "batch_norm": False,
            "activation_checkpointing": False,
        },
    }
    assert is_primitive(hparams)
    assert isinstance(run.model.net, MLP)
    assert [m.out_features for m in run.model.net.modules() if isinstance(m, nn.Linear)] == [64, 64, 3]


# -- the subclasses declare their own arguments; BaseTask's pass through **kwargs -----------------------

#: each task's own arguments, those its constructor declares; the rest are its bases'
OWN = {
    Classifier: ["label_smoothing", "class_weights"],
    Regressor: ["loss_fn", "huber_delta", "standardize_target", "target_transform"],
    ManualClassifier: ["accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm"],
}
TASKS = list(OWN)


def declared(cls: type) -> list[str]:
    """The named arguments ``cls.__init__`` declares itself (not ``self``, not ``**kwargs``)."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in parameters if p.name != "self" and p.kind is not p.VAR_KEYWORD]


def every_argument(task: type[BaseTask]) -> list[str]:
    """What the CLI reads for ``task``: its own arguments, then each base's up to BaseTask."""
    mro = task.__mro__[: task.__mro__.index(BaseTask) + 1]
    return [name for cls in mro for name in declared(cls)]


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.__name__)
def test_each_subclass_declares_only_its_own_arguments(task: type[BaseTask]) -> None:
    parameters = list(inspect.signature(task).parameters.values())
    assert [p.name for p in parameters[:-1]] == OWN[task]
    # keyword-only, so a positional call cannot shift a base's argument into one of them
    assert all(p.kind is p.KEYWORD_ONLY for p in parameters[:-1])
    # the rest reach the base through **kwargs, not written out again
    assert parameters[-1].kind is inspect.Parameter.VAR_KEYWORD
    inherited = set(every_argument(task)) - set(OWN[task])
    assert {"in_features", "out_features", "net", "optimizer"} <= inherited
    assert not inherited & set(OWN[task])
    # a name is declared once along the chain: no argument shadows a base's
    assert len(every_argument(task)) == len(set(every_argument(task)))


def non_default_base_arguments(out_features: int) -> dict[str, Any]:
    return {
        "in_features": 5,
        "out_features": out_features,
        "net": mlp(7, activation="tanh", dropout=0.25, batch_norm=True),
        "optimizer": functools.partial(torch.optim.SGD, lr=0.1),
        "scheduler": functools.partial(torch.optim.lr_scheduler.StepLR, step_size=2),
        "scheduler_interval": "step",
        "scheduler_monitor": "val/acc",
        "compile_net": True,
        "target_names": [f"target{k}" for k in range(out_features)],  # several targets, one output each
    }


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.__name__)
def test_subclass_hands_every_base_task_argument_on(task: type[BaseTask], monkeypatch) -> None:
    """A value given to the subclass reaches BaseTask, not its default, through every class between.

    Checked at BaseTask's door: the saved hyperparameters would not notice a dropped argument, since
    save_hyperparameters also reads the subclass's own frame.
    """
    arguments = non_default_base_arguments(out_features=2 if task is Regressor else 3)
    defaults = {name: p.default for name, p in inspect.signature(BaseTask).parameters.items()}
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
    model = task(**arguments)
    assert received == arguments
    # and took effect: the net the factory built
    assert sum(isinstance(m, nn.BatchNorm1d) for m in model.net.modules()) == 1


def documented_arguments(task: type[BaseTask]) -> dict[str, str]:
    """Each argument's description, the subclass's own over its bases' (as jsonargparse reads them)."""
    docs: dict[str, str] = {}
    for cls in reversed(task.__mro__[: task.__mro__.index(BaseTask) + 1]):
        # parse() raises on a malformed Args section, which would otherwise drop every description
        parsed = docstring_parser.parse(cls.__doc__ or "", style=docstring_parser.DocstringStyle.GOOGLE)
        docs.update({p.arg_name: p.description or "" for p in parsed.params})
    return docs


def shown_help(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    """What ``fit <words>`` prints and exits 0 on; argparse wraps lines (at hyphens too), so with all
    whitespace removed."""
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *words])
    assert exit_.value.code == 0
    return "".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.__name__)
def test_help_describes_every_argument_the_bases_too(task: type[BaseTask], capsys, workdir: Path) -> None:
    docs = documented_arguments(task)
    names = every_argument(task)
    assert set(names) <= {name for name, text in docs.items() if text}
    shown = shown_help(capsys, "--model.help", f"{task.__module__}.{task.__name__}")
    # BaseTask's arguments too, though the subclass only passes them on through **kwargs
    for name in names:
        assert f"--model.{name}" in shown, name
        assert "".join(docs[name].split()) in shown, name
    assert "--model.kwargs" not in shown


def test_help_describes_the_nets_arguments(capsys, workdir: Path) -> None:
    parsed = docstring_parser.parse(MLP.__doc__ or "", style=docstring_parser.DocstringStyle.GOOGLE)
    docs = {p.arg_name: p.description or "" for p in parsed.params}
    names = [
        name for name in inspect.signature(MLP).parameters if name not in ("in_features", "out_features")
    ]
    assert names
    assert set(names) <= {name for name, text in docs.items() if text}
    shown = shown_help(capsys, "--model=src.models.Classifier", "--model.net.help", "src.nets.MLP")
    # jsonargparse names them from the net's own key: --net.hidden_sizes is model.init_args.net's
    for name in names:
        assert f"--net.{name}" in shown, name
        assert "".join(docs[name].split()) in shown, name


# -- BaseTask's required hooks are abstract: leaving one out fails at construction, not mid-training --

REQUIRED_HOOKS = ["build_metrics", "loss", "metric_inputs", "predict_step"]


def task_without(hook: str) -> type[BaseTask]:
    """A BaseTask subclass that defines every required hook except ``hook`` (borrowed from Classifier, with
    the property they read)."""
    body = {name: getattr(Classifier, name) for name in REQUIRED_HOOKS if name != hook}
    body["multilabel"] = Classifier.multilabel
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
