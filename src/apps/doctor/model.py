"""Checks of the model and its loop, from what a module holds and what its first steps showed."""

import math
import statistics
from collections.abc import Iterable

import torch
from torch import nn

from src.apps.doctor.findings import Finding

#: initial loss outside [1/FAR, FAR] times the loss of an all-zero output counts as far off
FAR = 1.5
#: share of watched steps on which clipping fired that counts as "every step"
CLIPPED_SHARE = 0.9
#: growth of the gradient norm over the watched steps that counts as exploding
EXPLODING = 100.0
#: a parameter tensor moved by less than this, relative to its size, did not move
STILL = 1e-5
#: share of training time spent waiting for the next batch above which the loader is the bottleneck
LOADER_SHARE = 0.5
#: an overfitting run on one batch must end below this share of the loss of the best prediction of that
#: batch that ignores the input: a model cut off from its input never gets below 1, and one that reads it
#: at a regularized config's small LR may take more than the probe's steps to get far below (the penguins
#: table of the docs reaches about half of it in 40 steps)
OVERFIT = 0.75
#: without that loss (a module without a loss function): below this share of its first loss
OVERFIT_FIRST = 0.5
#: layers whose behaviour differs between training and evaluation
MODE_DEPENDENT = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
)


def _names(names: list[str], most: int = 4) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def layers_in_python_lists(model: nn.Module) -> Finding | None:
    """Modules kept in a plain list, tuple or dict attribute, where ``nn.Module`` cannot see them."""
    registered = {id(module) for module in model.modules()}
    hidden = []
    for prefix, module in model.named_modules():
        for attribute, value in vars(module).items():
            if not isinstance(value, list | tuple | dict):
                continue
            items = value.values() if isinstance(value, dict) else value
            # a plain list of layers that are registered elsewhere too (self.a, then [self.a, ...]) is fine
            count = sum(isinstance(item, nn.Module) and id(item) not in registered for item in items)
            if count:
                hidden.append(f"{prefix + '.' if prefix else ''}{attribute} ({count} layers)")
    if not hidden:
        return None
    return Finding(
        "layers-in-python-list",
        f"layers kept in a plain Python list or dict: {_names(hidden)}",
        "nn.Module does not look inside plain containers: those layers are missing from parameters() (never "
        "trained), from state_dict() (never saved) and from .to() (left on the CPU)",
        "hold them in nn.ModuleList or nn.ModuleDict (or nn.Sequential)",
    )


def frozen(model: nn.Module) -> Finding | None:
    parameters = list(model.parameters())
    if not parameters or any(p.requires_grad for p in parameters):
        return None  # no parameters at all: torch refuses to build the optimizer, loudly
    return Finding(
        "loss-not-moving",
        f"none of the {len(parameters)} parameter tensors requires a gradient",
        "with every weight frozen there is nothing to train: backward fails, or the loss stays where it is",
        "unfreeze what should train (requires_grad_(True)), at least the head",
    )


def not_in_optimizer(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer]) -> Finding | None:
    held = {id(p) for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]}
    missing = [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in held]
    if not missing:
        return None
    return Finding(
        "param-not-in-optimizer",
        f"{len(missing)} trainable parameter tensors are in no optimizer: {_names(missing)}",
        "they get gradients but are never updated, so they keep their random initial values",
        "build the optimizer from self.parameters() after every layer exists (configure_optimizers), or "
        "freeze them on purpose (requires_grad_(False))",
    )


def no_grad(model: nn.Module) -> Finding | None:
    """Trainable parameters without a gradient at the first optimizer step."""
    missing = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if not missing:
        return None
    return Finding(
        "param-no-grad",
        f"{len(missing)} trainable parameter tensors got no gradient in the first step: {_names(missing)}",
        "they are not on the path from the input to the loss (a layer built but not called, a branch cut off "
        "by .detach() or .item(), an output left out of the loss), so they never train",
        "use them in forward, or delete them, or freeze them on purpose (requires_grad_(False))",
    )


def probabilities_into_loss(output: torch.Tensor) -> Finding | None:
    """Outputs of a classifier that already lie in [0, 1]: softmax or sigmoid before a loss on logits."""
    if output.numel() < 8 or not torch.isfinite(output).all() or output.min() < 0 or output.max() > 1:
        return None
    rows_sum_to_one = (
        output.dim() == 2
        and output.shape[-1] > 1
        and torch.allclose(
            output.sum(-1), torch.ones(len(output), dtype=output.dtype, device=output.device), atol=1e-4
        )
    )
    layer = "a softmax" if rows_sum_to_one else "a sigmoid"
    sums = " and each row sums to 1" if rows_sum_to_one else ""
    return Finding(
        "probabilities-into-loss",
        f"all {output.numel()} outputs of the first batch lie in [0, 1]{sums}: the net ends with {layer}, so "
        "the loss gets probabilities",
        "cross_entropy and binary_cross_entropy_with_logits apply (log-)softmax or sigmoid themselves; "
        "applied twice, the gradients shrink and the loss cannot go below log(1 + (C-1)/e)",
        f"remove {layer} from the net and feed raw logits; apply it only for predictions",
    )


def initial_loss(loss: float, expected: float, what: str) -> Finding | None:
    """The first batch's loss against that of an all-zero output (what a net that knows nothing scores)."""
    if not math.isfinite(loss) or expected / FAR <= loss <= expected * FAR:
        return None  # a non-finite loss is reported by exploding()
    return Finding(
        "initial-loss",
        f"the first batch's loss is {loss:.4g}, but {what} scores {expected:.4g}",
        "at the start the outputs should be near zero and the loss near that value; far above it, the first "
        "steps go into shrinking overconfident outputs (a badly scaled last layer, inputs not standardized); "
        "far below it, the loss is not measuring what you think",
        "initialize the last layer small (or zero it), standardize the inputs, check the loss's arguments",
    )


def not_moving(moved: int, total: int, steps: int) -> Finding | None:
    if moved or not steps:
        return None
    return Finding(
        "loss-not-moving",
        f"none of the {total} trainable parameter tensors moved in {steps} optimizer steps",
        "training runs and logs a loss while learning nothing: the gradients are zeroed between backward and "
        "step, the LR is 0, or the weights are frozen (weight decay alone does not count as moving)",
        "zero gradients before backward, never between backward and step (Lightning does it right unless a "
        "hook overrides it), and check the optimizer's lr and the parameters' requires_grad",
    )


def non_finite_from_the_start(losses: list[float]) -> Finding | None:
    if not losses or math.isfinite(losses[0]):
        return None
    return Finding(
        "loss-non-finite",
        f"the loss of the very first batch is {losses[0]}",
        "before any step the weights are still finite, so the NaN comes from the data or the loss itself (a "
        "log or division of a value that can be zero or negative); every step after it writes NaN",
        "look for NaN in the inputs (data-non-finite) and guard log/sqrt/division in the forward and loss",
    )


def exploding(norms: list[float], losses: list[float]) -> Finding | None:
    if losses and not math.isfinite(losses[0]):
        return None  # non_finite_from_the_start() says it
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    bad_norm = next((i for i, v in enumerate(norms) if not math.isfinite(v)), None)
    if bad is not None or bad_norm is not None:
        saw = (
            f"the loss became {losses[bad]} at step {bad}"
            if bad is not None
            else f"the gradient norm became {norms[bad_norm]} at step {bad_norm}"  # type: ignore[index]
        )
    elif len(norms) >= 2 and max(norms[-5:]) > EXPLODING * norms[0] > 0:
        saw = f"the gradient norm grew from {norms[0]:.3g} to {max(norms[-5:]):.3g} in {len(norms)} steps"
    else:
        return None
    return Finding(
        "grad-norm-exploding",
        saw,
        "each step overshoots and the next gradient is larger: the weights run off to infinity or NaN and "
        "the run is lost, often long after the cause",
        "lower the LR, clip the gradient norm (trainer.gradient_clip_val), standardize inputs and targets",
    )


def clipping_every_step(norms: list[float], clipped: list[bool], threshold: float) -> Finding | None:
    if len(clipped) < 5 or sum(clipped) < CLIPPED_SHARE * len(clipped):
        return None
    return Finding(
        "clipping-every-step",
        f"clipping fired on {sum(clipped)} of {len(clipped)} optimizer steps (threshold {threshold:.3g}, "
        f"gradient size before clipping: median {statistics.median(norms):.3g})",
        "clipped on every step, the update is the LR times a fixed-size gradient: the threshold, not the "
        "optimizer, sets the step size, and the LR you chose no longer means what it says",
        "raise trainer.gradient_clip_val above the usual gradient norm (train/optimization/grad_norm in "
        "TensorBoard; clipping should catch spikes only), or set it to null",
    )


def loader_share(data_time: float, step_time: float, steps: int) -> Finding | None:
    total = data_time + step_time
    if steps < 5 or total <= 0 or data_time / total <= LOADER_SHARE:
        return None
    return Finding(
        "loader-share",
        f"the loop waited for the next batch {data_time / total:.0%} of the time over {steps} steps "
        f"({1000 * data_time / steps:.3g} ms of {1000 * total / steps:.3g} ms per step)",
        "the model idles while batches are built, and a faster model or device will not make training faster",
        "keep tensors in memory and batch by indexing (TensorBatches), move per-sample work out of "
        "__getitem__, or raise data.num_workers (with persistent workers)",
    )


def val_train_mode(layers: list[str], stochastic: bool) -> Finding | None:
    if not layers and not stochastic:
        return None
    saw = (
        f"{_names(layers)} still in training mode during validation"
        if layers
        else "two forward passes of the same validation batch in eval mode gave different outputs"
    )
    return Finding(
        "val-train-mode",
        saw,
        "dropout keeps dropping and BatchNorm keeps using (and updating) batch statistics, so validation "
        "scores are noisy and lower than what the model does, and evaluations disagree with each other",
        "do not call .train() in validation code; use nn.Dropout modules, or F.dropout(x, p, training=self."
        "training), never F.dropout(x, p) alone",
    )


def val_output_graph(names: list[str]) -> Finding | None:
    if not names:
        return None
    return Finding(
        "val-output-graph",
        f"validation returned tensors that carry an autograd graph: {_names(names)}",
        "every kept output keeps its whole forward graph alive: memory grows with each validation batch, and "
        "the numbers are not what the model computes under no_grad",
        "do not re-enable gradients in validation code (torch.enable_grad, set_grad_enabled(True)); return "
        ".detach()ed tensors",
    )


def cannot_overfit(losses: list[float], rows: int, targets: int, input_free: float | None) -> Finding | None:
    """The loss on one fixed batch after training on it: below ``OVERFIT`` times the loss of the best
    prediction that ignores the input (``input_free``), which no model cut off from its input can reach;
    without that loss (a module with no ``loss`` function), below ``OVERFIT`` times its first loss."""
    if len(losses) < 2 or not math.isfinite(losses[0]):
        return None
    last = min(losses[-5:])
    bar, share = (losses[0], OVERFIT_FIRST) if input_free is None else (input_free, OVERFIT)
    if last <= share * bar:
        return None
    reached = f" ({last / bar:.0%} of it)" if math.isfinite(last) and bar > 0 else ""
    against = (
        f"from {losses[0]:.4g} to {last:.4g}{reached}"
        if input_free is None
        else f"from {losses[0]:.4g} to {last:.4g}, where the best prediction that ignores the input scores "
        f"{input_free:.4g}{reached}"
    )
    size = f"{rows} rows" if targets <= rows else f"{rows} rows ({targets} targets)"
    return Finding(
        "overfit-one-batch",
        f"trained {len(losses)} steps on one fixed batch of {size}, the loss only went {against}",
        "any working model memorizes a handful of rows quickly; one that cannot has a bug between data, net "
        "and loss (inputs paired with the wrong targets, shapes that broadcast in the loss, an output cut "
        "off from the input) or far too little capacity or LR",
        "check the shapes reaching the loss (output (B, 1) against target (B,) broadcasts to (B, B)), that "
        "x and y are indexed together, and that the output depends on the input",
    )
