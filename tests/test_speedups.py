"""The speed-ups of ``src/speedups.py``: each one's canary fails the day the internal it relies on
changes, a run with it equals a run without it to the bit, and its off switch leaves things untouched."""

from collections import Counter
from typing import Any

import lightning as L
import pytest
import torch
import torchmetrics
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer import call
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from src.speedups import BATCH_HOOKS, Speedups, canary, skip_no_op_batch_hooks

STEPS, BATCH_SIZE, EVAL_ROWS = 2, 2, 8
#: how often each batch hook runs in a fit of STEPS steps (one epoch, then validation), a test and a predict
CALLS = {
    **dict.fromkeys(BATCH_HOOKS[:6], STEPS),  # every training step
    **dict.fromkeys(BATCH_HOOKS[6:], EVAL_ROWS // BATCH_SIZE),  # every batch of the evaluation loader
}
#: the hooks CountsBatchEnds overrides; it leaves the other eight as ``Callback``'s
BATCH_ENDS = ("on_train_batch_end", "on_validation_batch_end", "on_test_batch_end", "on_predict_batch_end")


class Tiny(L.LightningModule):
    """A linear regression on three features, with every stage's step defined."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)

    @override
    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    @override
    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.training_step(batch, batch_idx)

    @override
    def test_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.training_step(batch, batch_idx)

    @override
    def predict_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.net(batch[0])

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class HalvesGradients(Callback):
    """Acts on training at two batch hooks, so that a hidden overridden hook changes the weights."""

    @override
    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for p in pl_module.parameters():
            assert p.grad is not None
            p.grad.mul_(0.5)

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        torch.nn.utils.clip_grad_value_(pl_module.parameters(), 0.05)


class InheritsHooks(HalvesGradients):
    """Overrides nothing itself: its hooks come through a base other than ``Callback``, and must stay."""


class CountsBatchEnds(Callback):
    """Counts the calls of the batch hooks it overrides, :data:`BATCH_ENDS`."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    @override
    def on_train_batch_end(self, *args: Any) -> None:
        self.calls["on_train_batch_end"] += 1

    @override
    def on_validation_batch_end(self, *args: Any) -> None:
        self.calls["on_validation_batch_end"] += 1

    @override
    def on_test_batch_end(self, *args: Any) -> None:
        self.calls["on_test_batch_end"] += 1

    @override
    def on_predict_batch_end(self, *args: Any) -> None:
        self.calls["on_predict_batch_end"] += 1


def quiet_trainer(*callbacks: Callback) -> L.Trainer:
    """A Trainer of STEPS steps with ``callbacks`` and none of its own: no logger, bar or checkpoints."""
    return L.Trainer(
        max_steps=STEPS,
        callbacks=list(callbacks),
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )


def loader(rows: int = EVAL_ROWS) -> DataLoader[tuple[torch.Tensor, ...]]:
    """``rows`` random rows, the same on every call; ``STEPS * BATCH_SIZE`` of them make one epoch of fit."""
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(rows, 3, generator=generator), torch.randn(rows, 1, generator=generator))
    return DataLoader(data, batch_size=BATCH_SIZE)


def fit(model: L.LightningModule, *callbacks: Callback) -> L.Trainer:
    run = quiet_trainer(*callbacks)
    run.fit(model, loader(STEPS * BATCH_SIZE), loader())
    return run


def fitted_weights(*callbacks: Callback) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = Tiny()
    fit(model, *callbacks)
    return model.state_dict()


@pytest.fixture
def empty_hook_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of ``Callback``'s own empty batch hooks on a :class:`CountsBatchEnds`, by hook name.

    Patched on ``Callback`` itself, so that every subclass that leaves a hook alone still inherits it as
    ``Callback``'s, and the trick still recognises it as a no-op.
    """
    calls: Counter[str] = Counter()
    for name in BATCH_HOOKS:

        def empty(self: Callback, *args: Any, name: str = name, **kwargs: Any) -> None:
            if isinstance(self, CountsBatchEnds):
                calls[name] += 1

        monkeypatch.setattr(Callback, name, empty)
    return calls


# -- skip_no_op_batch_hooks ------------------------------------------------------------------------------


def test_the_canary_finds_the_internals_as_the_tricks_assume() -> None:
    assert canary() == []


def test_the_canary_fails_when_the_dispatch_stops_skipping_non_callables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def calls_every_hook(trainer: L.Trainer, hook_name: str, *args: Any, **kwargs: Any) -> None:
        for callback in trainer.callbacks:  # type: ignore[attr-defined]
            getattr(type(callback), hook_name)(callback, trainer, trainer.lightning_module, *args, **kwargs)

    monkeypatch.setattr(call, "_call_callback_hooks", calls_every_hook)
    assert len(canary()) == 1


@pytest.mark.parametrize("enabled", [True, False], ids=["skipping", "plain"])
def test_lightning_skips_a_hook_set_to_none_and_still_calls_the_overridden_ones(
    enabled: bool, empty_hook_calls: Counter[str]
) -> None:
    counting = CountsBatchEnds()
    Speedups(skip_no_op_batch_hooks=enabled).apply([counting])
    hidden = {name for name in BATCH_HOOKS if getattr(counting, name) is None}
    assert hidden == (set(BATCH_HOOKS) - set(BATCH_ENDS) if enabled else set())
    model = Tiny()
    run = fit(model, counting)
    run.test(model, loader(), verbose=False)
    run.predict(model, loader())
    assert counting.calls == {name: CALLS[name] for name in BATCH_ENDS}
    # Callback's empty hooks: never called once hidden, called at every batch while not
    left_alone = {name: CALLS[name] for name in BATCH_HOOKS if name not in BATCH_ENDS}
    assert empty_hook_calls == (Counter() if enabled else left_alone)


def test_a_fit_with_the_trick_equals_one_without_to_the_bit() -> None:
    plain = fitted_weights(InheritsHooks())
    callback = InheritsHooks()
    Speedups().apply([callback])
    skipping = fitted_weights(callback)
    assert {name for name in BATCH_HOOKS if getattr(callback, name) is None}  # the trick did act
    torch.testing.assert_close(skipping, plain, rtol=0, atol=0)
    # and the callback's hooks matter: had the trick hidden them, the weights would differ
    untouched = fitted_weights()
    assert not all(torch.equal(plain[k], untouched[k]) for k in plain)


def test_inherited_overrides_stay_callable() -> None:
    callback = InheritsHooks()
    skip_no_op_batch_hooks(callback)
    assert callable(callback.on_after_backward)
    assert callable(callback.on_before_optimizer_step)
    assert callback.on_train_batch_start is None


def test_the_off_switch_leaves_the_callback_untouched() -> None:
    callback = CountsBatchEnds()
    before = dict(vars(callback))
    Speedups(skip_no_op_batch_hooks=False).apply([callback])
    assert vars(callback) == before
    Speedups().apply([callback])  # and the switch is what kept it so
    assert vars(callback) != before


# -- skip_idle_log_moves ---------------------------------------------------------------------------------


class LogsEveryStep(Tiny):
    """Logs a tensor and a torchmetrics object in every training and validation step, as tutorials do."""

    def __init__(self) -> None:
        super().__init__()
        self.train_mae = torchmetrics.MeanAbsoluteError()
        self.val_mae = torchmetrics.MeanAbsoluteError()

    @override
    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self.net(x)
        loss = nn.functional.mse_loss(out, y)
        self.train_mae(out, y)
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        self.log("train/mae", self.train_mae, on_step=False, on_epoch=True)
        return loss

    @override
    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        out = self.net(x)
        self.val_mae(out, y)
        self.log("val/loss", nn.functional.mse_loss(out, y))
        self.log("val/mae", self.val_mae)


def logged_fit(enabled: bool) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A fit of LogsEveryStep with the shortcut on or off: its callback_metrics and weights."""
    Speedups(skip_idle_log_moves=enabled).apply([])
    torch.manual_seed(0)
    model = LogsEveryStep()
    run = quiet_trainer()
    run.fit(model, loader(STEPS * BATCH_SIZE), loader())
    return dict(run.callback_metrics), model.state_dict()


@pytest.fixture
def restore_log_moves() -> Any:
    yield
    Speedups().apply([])  # the shipped setting, for the tests that follow in this process


def test_a_fit_that_logs_every_step_is_the_same_to_the_bit_with_idle_moves_skipped(
    restore_log_moves: Any,
) -> None:
    plain_metrics, plain_weights = logged_fit(enabled=False)
    skipping_metrics, skipping_weights = logged_fit(enabled=True)
    assert set(plain_metrics) == {
        "train/loss_step",
        "train/loss_epoch",
        "train/loss",
        "train/mae",
        "val/loss",
        "val/mae",
    }
    torch.testing.assert_close(skipping_metrics, plain_metrics, rtol=0, atol=0)
    torch.testing.assert_close(skipping_weights, plain_weights, rtol=0, atol=0)


def test_a_stored_value_on_its_device_is_left_alone_and_any_other_moved(restore_log_moves: Any) -> None:
    from lightning.pytorch.trainer.connectors.logger_connector.result import _Metadata, _ResultMetric

    stored = _ResultMetric(_Metadata(fx="training_step", name="loss"), is_tensor=True)
    buffers = vars(stored)["_buffers"]
    Speedups(skip_idle_log_moves=True).apply([])
    assert stored.to(torch.device("cpu")) is stored
    assert vars(stored)["_buffers"] is buffers  # not walked: Lightning's walk rebuilds every dict
    Speedups(skip_idle_log_moves=False).apply([])
    stored.to(torch.device("cpu"))
    assert vars(stored)["_buffers"] is not buffers  # the off switch: Lightning's own walk
    # a value logged on another device: the stored one is moved there, as without the shortcut
    Speedups(skip_idle_log_moves=True).apply([])
    stored.to(torch.device("meta"))
    assert stored.value.device == torch.device("meta")


def test_the_canary_fails_when_log_stops_moving_the_stored_value_by_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lightning.pytorch.trainer.connectors.logger_connector import result

    def log(self: Any, fx: str, name: str, value: Any, **kwargs: Any) -> None:
        self[f"{fx}.{name}"] = value

    monkeypatch.setattr(result._ResultCollection, "log", log)
    assert canary() == ["_ResultCollection.log no longer moves the stored value with .to(value.device)."]
