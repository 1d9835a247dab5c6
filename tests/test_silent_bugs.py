"""The silent training-loop bugs the PyTorch tutorials warn about, each run next to the right loop.

One test per bug. Each one (1) checks the reference, ``examples.loop``, against an expectation computed
without it (gradient descent written as algebra, a closed form, a direct evaluation), so breaking the
loop breaks the test; (2) runs the bug written out by hand and shows that it gives another result; and
(3) checks the symptom you would see. Where the template's Lightning path rules the bug out, a
``test_lightning_...`` test checks that claim. The crib sheet in docs/loop.md lists them all.
"""

import gc
import math
import weakref
from collections.abc import Callable, Iterator
from functools import partial

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

from examples.loop import evaluate, fit, predict
from examples.test_loop import descend_by_hand, make_batches, make_net
from src.models import Classifier
from src.nets import MLP

SGD = partial(torch.optim.SGD, lr=0.1)


def params_of(net: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in net.named_parameters()}


def assert_differs(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    with pytest.raises(AssertionError):
        torch.testing.assert_close(actual, expected)


def reference_sgd(batches: list, **fit_args) -> dict[str, torch.Tensor]:
    """``examples.loop.fit`` with plain SGD, checked against gradient descent written as algebra."""
    net = make_net()
    clip = fit_args.get("gradient_clip_val")
    expected = descend_by_hand(make_net(), [[b] for b in batches], lr=0.1, divide_by=1, clip_norm=clip)
    fit(net, batches, optimizer=SGD, **fit_args)
    torch.testing.assert_close(params_of(net), expected)
    return expected


def trainer(**kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kwargs,
    )


def classifier(**kwargs) -> Classifier:
    """The template's task with ``make_net``'s net injected (4 features, 3 classes, one hidden 8), and its
    initial weights."""
    model = Classifier(
        in_features=4,
        out_features=3,
        net=partial(MLP, hidden_sizes=[8]),
        optimizer=SGD,
        **kwargs,
    )
    model.net.load_state_dict(make_net().state_dict())
    return model


def loader(batches: list) -> DataLoader:
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    return DataLoader(TensorDataset(x, y), batch_size=len(batches[0][1]))


# -- zero_grad ----------------------------------------------------------------------------------------


def test_zero_grad_between_backward_and_step_means_the_weights_never_move() -> None:
    batches = make_batches([8, 8])
    expected = reference_sgd(batches)
    net = make_net()
    optimizer = SGD(net.parameters())
    for x, y in batches:
        F.cross_entropy(net(x), y).backward()
        optimizer.zero_grad()  # BUG: wipes the gradients backward just computed
        optimizer.step()
    assert_differs(params_of(net), expected)
    # symptom: training "runs", the loss is logged, and not one weight has changed
    torch.testing.assert_close(params_of(net), params_of(make_net()), rtol=0, atol=0)


def test_forgotten_zero_grad_adds_every_old_gradient_into_each_step() -> None:
    batches = make_batches([8, 8, 8])
    expected = reference_sgd(batches)
    net = make_net()
    optimizer = SGD(net.parameters())
    grads_seen = []
    for x, y in batches:
        # BUG: no optimizer.zero_grad(): backward adds to what .grad already holds
        F.cross_entropy(net(x), y).backward()
        grads_seen.append(net.head.bias.grad.clone())
        optimizer.step()
    assert_differs(params_of(net), expected)
    # symptom: each step applies the sum of every gradient so far, so the steps keep growing
    params, accumulated = params_of(make_net()), None
    for x, y in batches:
        g = torch.func.grad(lambda p, x=x, y=y: F.cross_entropy(torch.func.functional_call(net, p, (x,)), y))(
            params
        )
        accumulated = g if accumulated is None else {n: accumulated[n] + g[n] for n in g}
        params = {n: params[n] - 0.1 * accumulated[n] for n in params}
    torch.testing.assert_close(grads_seen[-1], accumulated["head.bias"])
    torch.testing.assert_close(params_of(net), params)


# -- clipping ---------------------------------------------------------------------------------------------


def update_norm(after: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(((after[n] - before[n]) ** 2).sum().item() for n in before))


def test_clipping_before_backward_clips_nothing() -> None:
    batches = make_batches([8])
    expected = reference_sgd(batches, gradient_clip_val=0.01)
    net = make_net()
    optimizer = SGD(net.parameters())
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        nn.utils.clip_grad_norm_(net.parameters(), 0.01)  # BUG: there are no gradients yet
        loss.backward()
        optimizer.step()
    assert_differs(params_of(net), expected)
    # symptom: the step is as long as without clipping, far beyond lr * 0.01
    unclipped = descend_by_hand(make_net(), [batches], lr=0.1, divide_by=1)
    torch.testing.assert_close(params_of(net), unclipped)
    start = params_of(make_net())
    assert update_norm(expected, start) == pytest.approx(0.1 * 0.01, rel=1e-4)
    assert update_norm(params_of(net), start) > 10 * 0.1 * 0.01


def test_clipping_after_step_leaves_the_update_unclipped_while_the_grads_look_clipped() -> None:
    batches = make_batches([8])
    expected = reference_sgd(batches, gradient_clip_val=0.01)
    net = make_net()
    optimizer = SGD(net.parameters())
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
        norm = nn.utils.clip_grad_norm_(net.parameters(), 0.01)  # BUG: step already used the gradients
    assert_differs(params_of(net), expected)
    # symptom: a logged gradient norm looks clipped, the update that was applied was not
    after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in net.parameters()]))
    assert after.item() == pytest.approx(0.01, rel=1e-4)
    assert norm.item() > 10 * 0.01
    torch.testing.assert_close(params_of(net), descend_by_hand(make_net(), [batches], lr=0.1, divide_by=1))


def test_lightning_clips_after_backward_and_before_step() -> None:
    batches = make_batches([8])
    expected = descend_by_hand(make_net(), [batches], lr=0.1, divide_by=1, clip_norm=0.01)
    model = classifier()
    trainer(max_epochs=1, gradient_clip_val=0.01).fit(model, loader(batches), loader(batches))
    torch.testing.assert_close(params_of(model.net), expected)


# -- schedulers -------------------------------------------------------------------------------------------


def test_per_epoch_scheduler_stepped_per_batch_decays_len_loader_times_too_fast() -> None:
    batches, epochs, gamma = make_batches([4] * 5), 3, 0.5
    lr = fit(
        make_net(),
        batches,
        optimizer=SGD,
        scheduler=partial(StepLR, step_size=1, gamma=gamma),
        max_epochs=epochs,
    ).optimizer.param_groups[0]["lr"]
    assert lr == pytest.approx(0.1 * gamma**epochs)  # the closed form of StepLR(step_size=1)
    net = make_net()
    optimizer = SGD(net.parameters())
    scheduler = StepLR(optimizer, step_size=1, gamma=gamma)
    for _ in range(epochs):
        for x, y in batches:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(net(x), y).backward()
            optimizer.step()
            scheduler.step()  # BUG: an epoch schedule stepped once per batch
    # symptom: the LR is gamma**15 instead of gamma**3: training stalls after the first epoch
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * gamma ** (epochs * len(batches)))
    assert optimizer.param_groups[0]["lr"] < lr / 1000


def test_lightning_steps_an_epoch_scheduler_once_per_epoch_by_default() -> None:
    batches = make_batches([4] * 5)
    model = classifier(scheduler=partial(StepLR, step_size=1, gamma=0.5))
    assert model.hparams.scheduler_interval == "epoch"
    run = trainer(max_epochs=3)
    run.fit(model, loader(batches), loader(batches))
    assert run.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)


# -- validation -------------------------------------------------------------------------------------------


def test_validation_left_in_train_mode_gives_two_different_answers() -> None:
    net, batches = make_net(dropout=0.5), make_batches([16, 16])
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    net.eval()
    with torch.no_grad():
        direct = F.cross_entropy(net(x), y).item()
    assert evaluate(net, batches) == pytest.approx(direct, rel=1e-6)
    assert evaluate(net, batches) == evaluate(net, batches)

    def evaluate_in_train_mode() -> float:
        net.train()  # BUG: dropout stays on (what happens when net.eval() is forgotten after training)
        with torch.no_grad():
            return sum(F.cross_entropy(net(bx), by).item() * len(by) for bx, by in batches) / len(y)

    # symptom: the same weights, the same data, two different validation losses
    first, second = evaluate_in_train_mode(), evaluate_in_train_mode()
    assert first != second
    assert direct not in (first, second)


class Recording(Classifier):
    """Records the mode and the autograd state that Lightning runs validation under."""

    seen: list[tuple[bool, bool, bool]]

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.seen.append((self.net.training, torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
        super().validation_step(batch, batch_idx)


def test_lightning_validates_in_eval_mode_under_inference_mode() -> None:
    batches = make_batches([16, 16])
    model = Recording(in_features=4, out_features=3, net=partial(MLP, hidden_sizes=[8], dropout=0.5))
    model.seen = []
    run = trainer()
    first = run.validate(model, loader(batches), verbose=False)[0]["val/loss"]
    second = run.validate(model, loader(batches), verbose=False)[0]["val/loss"]
    assert model.seen == [(False, False, True)] * 4  # training=False, no grad, inference mode
    assert first == second == pytest.approx(evaluate(model.net, batches), rel=1e-6)


def test_validation_without_no_grad_returns_outputs_that_carry_a_graph() -> None:
    net, batches = make_net(), make_batches([16, 16])
    outputs = predict(net, batches)
    net.eval()
    with torch.no_grad():
        torch.testing.assert_close(outputs, net(torch.cat([b[0] for b in batches])))
    assert not outputs.requires_grad
    leaky = torch.cat([net(x) for x, _ in batches])  # BUG: no torch.no_grad() / inference_mode()
    # symptom: equal numbers, but each output keeps a graph (and its activations) alive
    torch.testing.assert_close(leaky.detach(), outputs)
    assert leaky.requires_grad
    assert leaky.grad_fn is not None


# -- logging the loss -------------------------------------------------------------------------------------


class Sentinel:
    """Lives exactly as long as the autograd node it is attached to."""


def track_graphs(loss_fn: Callable[..., torch.Tensor]) -> tuple[Callable[..., torch.Tensor], Iterator[int]]:
    """Wrap ``loss_fn`` so that each call reports how many earlier losses still have a live graph."""
    alive: list[weakref.ref] = []
    counts: list[int] = []

    def wrapped(*args: torch.Tensor) -> torch.Tensor:
        gc.collect()
        counts.append(sum(ref() is not None for ref in alive))
        loss = loss_fn(*args)
        if loss.grad_fn is not None:  # validation runs without autograd: nothing to track
            sentinel = Sentinel()
            loss.grad_fn.metadata["sentinel"] = sentinel  # freed with the node, not with the tensor
            alive.append(weakref.ref(sentinel))
        return loss

    return wrapped, iter(counts)


@pytest.mark.slow
def test_summing_loss_tensors_instead_of_item_keeps_every_steps_graph_alive() -> None:
    batches = make_batches([8] * 6)
    loss_fn, counts = track_graphs(F.cross_entropy)
    net = make_net()
    # lr=0: the weights stay put, so the epoch loss is the loss of the initial weights on all rows
    result = fit(net, batches, optimizer=partial(torch.optim.SGD, lr=0.0), loss_fn=loss_fn)
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    with torch.no_grad():
        assert result.history.train_loss == [pytest.approx(F.cross_entropy(net(x), y).item(), rel=1e-6)]
    # at most the previous batch's graph is still referenced when the next batch starts
    assert max(counts) <= 1

    loss_fn, counts = track_graphs(F.cross_entropy)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.0)
    total = 0.0
    for bx, by in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(net(bx), by)
        loss.backward()
        optimizer.step()
        total += loss  # BUG: a tensor with a graph, not loss.item() or loss.detach()
    # symptom: the running total is a graph that holds on to every batch of the epoch
    assert list(counts) == list(range(len(batches)))
    assert total.requires_grad
    assert total.item() / len(batches) == pytest.approx(result.history.train_loss[0], rel=1e-6)


class TrackedLoss(Classifier):
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.tracked(output, target)


@pytest.mark.slow
def test_lightning_keeps_no_old_step_graph_alive() -> None:
    model = TrackedLoss(in_features=4, out_features=3, net=partial(MLP, hidden_sizes=[8]), optimizer=SGD)
    model.tracked, counts = track_graphs(super(TrackedLoss, model).loss)
    trainer(max_epochs=1).fit(model, loader(make_batches([8] * 6)), loader(make_batches([8])))
    assert max(counts) <= 1


# -- the loss ---------------------------------------------------------------------------------------------


def test_softmax_before_cross_entropy_changes_the_gradients() -> None:
    x, y = make_batches([16])[0]
    torch.manual_seed(0)
    linear = MLP(4, 3, hidden_sizes=[])  # logits = x @ W.T + b
    w, b = linear.head.weight.detach().clone(), linear.head.bias.detach().clone()
    fit(linear, [(x, y)], optimizer=SGD)
    # closed form: d cross_entropy / d logits = (softmax(logits) - onehot(y)) / B
    delta = ((x @ w.T + b).softmax(-1) - F.one_hot(y, 3)) / len(y)
    torch.testing.assert_close(linear.head.weight, w - 0.1 * delta.T @ x)
    torch.testing.assert_close(linear.head.bias, b - 0.1 * delta.sum(0))

    torch.manual_seed(0)
    softmaxed = MLP(4, 3, hidden_sizes=[])

    def softmax_then_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.softmax(-1), target)  # BUG: cross_entropy applies log-softmax itself

    fit(softmaxed, [(x, y)], optimizer=SGD, loss_fn=softmax_then_cross_entropy)
    assert_differs(params_of(softmaxed), params_of(linear))
    # symptom: even a perfect, confident prediction keeps a loss of log(1 + (K-1)/e), so the loss plateaus
    perfect = 50.0 * F.one_hot(y, 3).float()
    assert F.cross_entropy(perfect, y).item() < 1e-6
    assert softmax_then_cross_entropy(perfect, y).item() == pytest.approx(math.log(1 + 2 / math.e), rel=1e-5)
    # the template's classifier takes the raw logits
    torch.testing.assert_close(classifier().loss(perfect, y), F.cross_entropy(perfect, y))


# -- where the parameters live ----------------------------------------------------------------------------


@pytest.fixture
def conversion_makes_new_parameters() -> Iterator[None]:
    """Module.to(dtype) replaces parameters by new objects, as it does for XLA and some tensor types.

    On CPU and CUDA, PyTorch converts in place by default (the Parameter objects survive), which hides
    the bug; ``load_state_dict(assign=True)`` and swapping a layer replace parameters the same way.
    """
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    yield
    torch.__future__.set_overwrite_module_params_on_conversion(False)


@pytest.mark.usefixtures("conversion_makes_new_parameters")
def test_optimizer_built_before_a_dtype_conversion_updates_discarded_parameters() -> None:
    batches = [(x.double(), y) for x, y in make_batches([8, 8])]
    expected = descend_by_hand(make_net().double(), [[b] for b in batches], lr=0.1, divide_by=1)
    net = make_net()
    fit(net, batches, optimizer=SGD, precision="64-true")  # converts first, builds the optimizer second
    torch.testing.assert_close(params_of(net), expected)

    net = make_net()
    optimizer = SGD(net.parameters())  # BUG: built before the conversion
    net.double()
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
    assert_differs(params_of(net), expected)
    # symptom: the net never moves; the optimizer holds the old float32 parameters, which get no gradient
    torch.testing.assert_close(params_of(net), params_of(make_net().double()), rtol=0, atol=0)
    assert all(p.dtype == torch.float32 for p in optimizer.param_groups[0]["params"])


class OptimizerHoldsModuleParameters(L.Callback):
    """Checks before each optimizer step that the optimizer holds the module's own parameters."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        held = optimizer.param_groups[0]["params"]
        self.seen.append(all(p is q for p, q in zip(held, pl_module.parameters(), strict=True)))


@pytest.mark.usefixtures("conversion_makes_new_parameters")
def test_lightning_builds_the_optimizer_after_the_dtype_conversion() -> None:
    batches = [(x.double(), y) for x, y in make_batches([8, 8])]
    model, check = classifier(), OptimizerHoldsModuleParameters()
    trainer(max_epochs=1, precision="64-true", callbacks=[check]).fit(model, loader(batches), loader(batches))
    assert check.seen == [True, True]
    expected = descend_by_hand(make_net().double(), [[b] for b in batches], lr=0.1, divide_by=1)
    torch.testing.assert_close(params_of(model.net), expected)


class ListMLP(nn.Module):
    """The net of ``make_net`` with its hidden layer kept in a Python list."""

    def __init__(self) -> None:
        super().__init__()
        reference = make_net()
        self.hidden = [reference.body[0], nn.ReLU()]  # BUG: a list, not nn.ModuleList / nn.Sequential
        self.head = reference.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = layer(x)
        return self.head(x)


def test_layers_in_a_python_list_are_invisible_to_parameters_and_never_train() -> None:
    batches = make_batches([8, 8])
    net = make_net()
    expected = reference_sgd(batches)
    # every layer of the template's net is registered and trained: 4*8 + 8 + 8*3 + 3 parameters
    assert sum(p.numel() for p in net.parameters()) == 4 * 8 + 8 + 8 * 3 + 3
    assert {name for name, _ in net.named_parameters()} == set(expected)
    listed = ListMLP()
    hidden_before = listed.hidden[0].weight.detach().clone()
    fit(listed, batches, optimizer=SGD)
    assert_differs(params_of(listed), expected)
    # symptom: the hidden layer is missing from parameters() and state_dict(), and never trains
    assert set(listed.state_dict()) == {"head.weight", "head.bias"}
    torch.testing.assert_close(listed.hidden[0].weight, hidden_before, rtol=0, atol=0)


def test_lightning_optimizer_holds_every_layer_of_the_templates_net() -> None:
    model = classifier()
    run = trainer(max_epochs=1)
    run.fit(model, loader(make_batches([8])), loader(make_batches([8])))
    held = {id(p) for p in run.optimizers[0].param_groups[0]["params"]}
    linears = [m for m in model.net.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 2
    assert all(id(m.weight) in held and id(m.bias) in held for m in linears)
