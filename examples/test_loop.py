"""The hand-written loop (examples/loop.py) against computations that share none of its code."""

from collections.abc import Sequence
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad
from torch.optim.lr_scheduler import ReduceLROnPlateau, StepLR

from examples.loop import evaluate, fit, predict
from src.nets import MLP

Batch = tuple[torch.Tensor, torch.Tensor]


def make_batches(sizes: Sequence[int], seed: int = 0, features: int = 4, classes: int = 3) -> list[Batch]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, features, generator=generator), torch.randint(0, classes, (n,), generator=generator))
        for n in sizes
    ]


def make_net(seed: int = 0, **kwargs) -> MLP:
    torch.manual_seed(seed)
    return MLP(4, 3, hidden_sizes=[8], **kwargs)  # the plain MLP the algebra below writes out


def descend_by_hand(
    net: nn.Module,
    groups: Sequence[Sequence[Batch]],
    lr: float,
    divide_by: int,
    clip_norm: float | None = None,
    start: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Plain gradient descent written as algebra: ``p -= lr * clip(sum(grad(loss_b)) / divide_by)``.

    One update per group of batches, from ``start`` (the net's own parameters when left out);
    gradients from ``torch.func.grad``, so no ``.grad``, no ``zero_grad`` and no optimizer are involved.
    """
    params = start or {name: p.detach().clone() for name, p in net.named_parameters()}

    def loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(net, params, (x,)), y)

    for group in groups:
        grads = [grad(loss)(params, x, y) for x, y in group]
        total = {name: sum(g[name] for g in grads) / divide_by for name in params}
        if clip_norm is not None:
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in total.values()])
            )
            total = {name: g * min(1.0, clip_norm / norm.item()) for name, g in total.items()}
        params = {name: params[name] - lr * total[name] for name in params}
    return params


def test_sgd_epochs_equal_gradient_descent_by_hand() -> None:
    batches = make_batches([8, 8, 8, 5])
    net = make_net()
    expected = descend_by_hand(net, [[b] for b in batches] * 2, lr=0.1, divide_by=1)
    result = fit(net, batches, optimizer=partial(torch.optim.SGD, lr=0.1), max_epochs=2)
    torch.testing.assert_close(dict(net.named_parameters()), expected)
    assert result.steps == 8


def test_accumulating_four_micro_batches_equals_one_batch_four_times_larger() -> None:
    (x, y) = make_batches([64])[0]
    micro = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]
    big, small = make_net(), make_net()
    fit(big, [(x, y)], optimizer=partial(torch.optim.SGD, lr=0.5))
    result = fit(small, micro, optimizer=partial(torch.optim.SGD, lr=0.5), accumulate_grad_batches=4)
    assert result.steps == 1
    torch.testing.assert_close(dict(small.named_parameters()), dict(big.named_parameters()))


def test_last_partial_group_steps_with_its_losses_divided_by_k_as_lightning_does() -> None:
    """7 batches, k=3: groups [0,1,2], [3,4,5], [6]; the last one steps with loss_6 / 3, not loss_6 / 1.

    Lightning's automatic loop divides every training loss by ``accumulate_grad_batches`` and steps on
    the last batch of an epoch, so the shorter group's update is a third of a mean-gradient step.
    """
    batches = make_batches([8] * 7)
    net, reference = make_net(), make_net()
    groups = [batches[0:3], batches[3:6], batches[6:7]]
    expected = descend_by_hand(reference, groups, lr=0.3, divide_by=3)
    result = fit(net, batches, optimizer=partial(torch.optim.SGD, lr=0.3), accumulate_grad_batches=3)
    assert result.steps == 3
    torch.testing.assert_close(dict(net.named_parameters()), expected)
    # the tutorials' other choice, a mean over the short group (loss_6 / 1), is a different result
    after_two = descend_by_hand(reference, groups[:2], lr=0.3, divide_by=3)
    mean_of_short_group = descend_by_hand(reference, groups[2:], lr=0.3, divide_by=1, start=after_two)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(dict(net.named_parameters()), mean_of_short_group)


def test_groups_restart_with_each_epoch() -> None:
    """5 batches, k=2, 2 epochs: [0,1], [2,3], [4] per epoch, never a group across the epoch boundary."""
    batches = make_batches([8] * 5)
    net = make_net()
    per_epoch = [batches[0:2], batches[2:4], batches[4:5]]
    expected = descend_by_hand(net, per_epoch * 2, lr=0.2, divide_by=2)
    result = fit(
        net, batches, optimizer=partial(torch.optim.SGD, lr=0.2), accumulate_grad_batches=2, max_epochs=2
    )
    assert result.steps == 6
    torch.testing.assert_close(dict(net.named_parameters()), expected)


def test_clipping_by_norm_limits_the_update_of_each_step() -> None:
    batches = make_batches([8, 8])
    net = make_net()
    expected = descend_by_hand(net, [[b] for b in batches], lr=1.0, divide_by=1, clip_norm=0.01)
    fit(net, batches, optimizer=partial(torch.optim.SGD, lr=1.0), gradient_clip_val=0.01)
    torch.testing.assert_close(dict(net.named_parameters()), expected)


def test_clipping_by_value_bounds_every_gradient_element() -> None:
    batches = make_batches([8])
    net = make_net()
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    free = descend_by_hand(net, [batches], lr=1.0, divide_by=1)
    fit(
        net,
        batches,
        optimizer=partial(torch.optim.SGD, lr=1.0),
        gradient_clip_val=1e-3,
        gradient_clip_algorithm="value",
    )
    for name, p in net.named_parameters():
        torch.testing.assert_close(p, before[name] + (free[name] - before[name]).clamp(-1e-3, 1e-3))


@pytest.mark.parametrize(("interval", "decays"), [("epoch", 3), ("step", 3 * 4)])
def test_scheduler_steps_once_per_epoch_or_once_per_optimizer_step(interval: str, decays: int) -> None:
    # 8 batches with k=2: 4 optimizer steps per epoch; a per-step scheduler counts those, not batches
    result = fit(
        make_net(),
        make_batches([4] * 8),
        optimizer=partial(torch.optim.SGD, lr=1.0),
        scheduler=partial(StepLR, step_size=1, gamma=0.9),
        scheduler_interval=interval,
        accumulate_grad_batches=2,
        max_epochs=3,
    )
    assert result.optimizer.param_groups[0]["lr"] == pytest.approx(0.9**decays)
    assert result.history.lr[0] == pytest.approx(0.9 ** (decays // 3))


def test_plateau_scheduler_watches_the_validation_loss() -> None:
    data = make_batches([8, 8])
    result = fit(
        make_net(),
        data,
        data,  # validated on what it trains on, so the validation loss falls every epoch
        optimizer=partial(torch.optim.SGD, lr=0.1),
        # mode="max" on a falling loss: no epoch after the first improves, so the LR halves twice
        scheduler=partial(ReduceLROnPlateau, mode="max", factor=0.5, patience=0),
        max_epochs=3,
    )
    val = result.history.val_loss
    assert val[0] > val[1] > val[2]
    assert result.scheduler.best == val[0]
    assert result.history.lr == [0.1, 0.05, 0.025]
    with pytest.raises(ValueError, match="ReduceLROnPlateau needs"):
        fit(make_net(), data, optimizer=torch.optim.SGD, scheduler=ReduceLROnPlateau)


def test_history_holds_plain_numbers_equal_to_direct_losses() -> None:
    train, val = make_batches([8, 6]), make_batches([5, 7], seed=1)
    net = make_net()
    # lr=0: the weights stay put, so the epoch's training loss is the loss of the initial weights
    result = fit(net, train, val, optimizer=partial(torch.optim.SGD, lr=0.0))
    x, y = torch.cat([b[0] for b in train]), torch.cat([b[1] for b in train])
    vx, vy = torch.cat([b[0] for b in val]), torch.cat([b[1] for b in val])
    with torch.no_grad():
        assert result.history.train_loss == [pytest.approx(F.cross_entropy(net(x), y).item(), rel=1e-6)]
        assert result.history.val_loss == [pytest.approx(F.cross_entropy(net(vx), vy).item(), rel=1e-6)]
    assert all(type(v) is float for v in [*result.history.train_loss, *result.history.val_loss])


def test_evaluation_runs_in_eval_mode_without_autograd() -> None:
    net = make_net(dropout=0.5)
    batches = make_batches([16, 16])
    outputs = predict(net, batches)
    assert not net.training
    assert outputs.shape == (32, 3)
    assert torch.is_inference(outputs)
    torch.testing.assert_close(outputs, net(torch.cat([b[0] for b in batches])).detach())
    assert evaluate(net, batches) == evaluate(net, batches)


def test_training_switches_train_mode_back_on_after_validation() -> None:
    net = make_net(dropout=0.5)
    seen_modes = []
    net.register_forward_pre_hook(lambda module, args: seen_modes.append(module.training))
    fit(net, make_batches([4]), make_batches([4]), optimizer=torch.optim.SGD, max_epochs=2)
    assert seen_modes == [True, False, True, False]


def test_bf16_mixed_runs_matmuls_in_bfloat16_and_keeps_weights_in_float32() -> None:
    batches = make_batches([16])
    seen_dtypes = []
    net = make_net()
    net.head.register_forward_hook(lambda module, args, output: seen_dtypes.append(output.dtype))
    fp32 = make_net()
    fit(net, batches, optimizer=partial(torch.optim.SGD, lr=0.5), precision="bf16-mixed")
    fit(fp32, batches, optimizer=partial(torch.optim.SGD, lr=0.5))
    assert seen_dtypes == [torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in net.parameters())
    # bfloat16 keeps 8 bits of mantissa: close to the float32 run, not equal to it
    torch.testing.assert_close(net.head.weight, fp32.head.weight, rtol=0.05, atol=0.01)
    assert not torch.equal(net.head.weight, fp32.head.weight)


def test_64_true_converts_the_net_before_the_optimizer_is_built() -> None:
    net = make_net()
    result = fit(net, make_batches([8]), optimizer=partial(torch.optim.SGD, lr=0.1), precision="64-true")
    assert all(p.dtype == torch.float64 for p in net.parameters())
    assert all(
        p is q for p, q in zip(result.optimizer.param_groups[0]["params"], net.parameters(), strict=True)
    )


def test_accumulation_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="accumulate_grad_batches=0 must be at least 1"):
        fit(make_net(), make_batches([4]), optimizer=torch.optim.SGD, accumulate_grad_batches=0)
