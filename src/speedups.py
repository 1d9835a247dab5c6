"""Speed-ups that lean on a dependency's internals: the one module allowed to, each with an off switch.

Everything else in ``src/`` keeps to documented APIs (``tests/test_private_api.py`` holds it to that).
A trick that needs an internal lives here instead, and says three things: the internal it relies on,
why it is worth it, and the upstream change that would make it unnecessary. :func:`canary` checks each
internal is still what the trick assumes, so a Lightning upgrade that changes one fails
``tests/test_speedups.py`` rather than silently slowing, or breaking, a run.
"""

import functools
import inspect
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Lightning is imported where a trick runs: the checkpoint keys below need none of it
    from lightning.pytorch.callbacks import Callback

#: the keys under which LightningCLI's instantiator saves, in a checkpoint's ``hyper_parameters``, the
#: class the module was built as and the instantiator itself (jsonargparse's private names). Unnecessary
#: once: Lightning saves the class under a public key.
SAVED_CLASS_KEY = "_class_path"
SAVED_INSTANTIATOR_KEY = "_instantiator"


def class_saved_by_the_cli(checkpoint: Mapping[str, Any]) -> str | None:
    """The class path LightningCLI saved in a checkpoint's hyperparameters, or ``None``."""
    class_path = dict(checkpoint.get("hyper_parameters") or {}).get(SAVED_CLASS_KEY)
    return class_path if isinstance(class_path, str) else None


#: the hooks the Trainer calls on every batch (the first six on every training step)
BATCH_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)


class Speedups:
    """Speed-ups that rely on Lightning internals, applied to the callbacks this project ships.

    Each switch turns one trick off without changing what a run computes: off, the run is the one
    plain Lightning would make, only slower.

    Args:
        skip_no_op_batch_hooks: Hide from the Trainer the per-batch hooks a callback leaves as
            ``Callback``'s empty methods, so each training step skips some 60 calls that do nothing.
        skip_idle_log_moves: Let ``self.log`` skip moving its stored value to the device it is on
            already (:func:`skip_idle_log_moves`); for this process, from this run on.
    """

    def __init__(self, skip_no_op_batch_hooks: bool = True, skip_idle_log_moves: bool = True) -> None:
        self.skip_no_op_batch_hooks = skip_no_op_batch_hooks
        self.skip_idle_log_moves = skip_idle_log_moves

    def apply(self, callbacks: "Iterable[Callback]") -> None:
        """Apply the enabled tricks to ``callbacks``, before the Trainer runs with them."""
        skip_idle_log_moves(self.skip_idle_log_moves)
        for callback in callbacks:
            if self.skip_no_op_batch_hooks:
                skip_no_op_batch_hooks(callback)


def skip_no_op_batch_hooks(callback: "Callback") -> None:
    """Hide from the Trainer the per-batch hooks that ``callback``'s class does not override.

    Lightning calls every hook of every callback on every batch, whether the callback acts there or
    not: each call builds the callback's ``state_key`` (for a ModelCheckpoint a dict's repr), a name
    for the profiler and a profiler context, about 1 µs, so a training step with the shipped callbacks
    paid for some 60 calls of ``Callback``'s empty methods.

    Internal relied on: ``lightning.pytorch.trainer.call._call_callback_hooks`` looks each hook up on
    the callback instance and skips it when it is not callable, so each such hook is shadowed on the
    instance by ``None``; nothing else in Lightning calls these hooks. Hooks the class overrides,
    itself or through a base other than ``Callback``, are left alone.

    Unnecessary once: ``_call_callback_hooks`` skips the hooks a callback does not override (Lightning's
    callback connector already asks ``is_overridden`` so for ``state_dict``), or caches per hook the
    callbacks that implement it.
    """
    from lightning.pytorch.callbacks import Callback

    for name in BATCH_HOOKS:
        if getattr(type(callback), name) is getattr(Callback, name):
            setattr(callback, name, None)


#: whether :func:`skip_idle_log_moves`'s shortcut is on, as the last call set it
_SKIP_IDLE_MOVES = {"on": False}


def skip_idle_log_moves(enabled: bool) -> None:
    """Let ``self.log`` skip the move of its stored value to the device when it is there already.

    Every ``self.log`` call (``LightningModule.log``) ends in ``_ResultCollection.log``, which moves the
    key's stored ``_ResultMetric`` to the logged value's device with ``_ResultMetric.to``: Lightning's
    general walk (``apply_to_collection``) over the object's whole ``__dict__``, which copies its metadata
    dataclass and rebuilds a dozen of ``nn.Module``'s dicts, about 0.6 ms a call on a CPU: more than a
    training step of a small net, paid by every value logged in every step. With this on, a stored value
    whose tensors (and metric objects) are all on that device already is left as it is, which is what the
    walk would have made of it; any other goes through Lightning's ``to`` unchanged.

    Internal relied on: ``_ResultCollection.log`` calls ``self[key].to(value.device)`` (one positional
    argument), and ``_ResultMetric.to`` only moves tensors and ``Metric`` objects. The method is wrapped
    once per process; ``enabled`` turns the shortcut on or off for what follows.

    Unnecessary once: ``_ResultMetric.to`` (or ``_ResultCollection.log``) skips the move when nothing is
    on another device.
    """
    from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultMetric

    _SKIP_IDLE_MOVES["on"] = enabled
    if getattr(_ResultMetric.to, "skips_idle_moves", False):
        return
    original = _ResultMetric.to

    @functools.wraps(original)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _SKIP_IDLE_MOVES["on"] and len(args) == 1 and not kwargs and _all_on(vars(self), args[0]):
            return self
        return original(self, *args, **kwargs)

    to.skips_idle_moves = True  # type: ignore[attr-defined]
    _ResultMetric.to = to  # type: ignore[method-assign]


def _all_on(value: Any, device: Any) -> bool:
    """Whether every tensor and metric object in ``value`` (through dicts, lists and tuples) is on
    ``device``; a dataclass or any other object counts as holding none (``_ResultMetric``'s metadata)."""
    import torch
    from torchmetrics import Metric

    if isinstance(value, torch.Tensor | Metric):
        return value.device == torch.device(device)
    if isinstance(value, dict):
        return all(_all_on(item, device) for item in value.values())
    if isinstance(value, list | tuple):
        return all(_all_on(item, device) for item in value)
    return True


def canary() -> list[str]:
    """The internals the tricks rely on that no longer look as they assume; empty while all do."""
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.trainer import call

    problems = [
        f"Callback has no hook {name}: BATCH_HOOKS names a hook Lightning no longer calls."
        for name in BATCH_HOOKS
        if not callable(getattr(Callback, name, None))
    ]
    dispatch = getattr(call, "_call_callback_hooks", None)
    if dispatch is None:
        return [*problems, "lightning.pytorch.trainer.call._call_callback_hooks is gone."]
    source = inspect.getsource(dispatch)
    if "getattr(callback, hook_name)" not in source or "callable(" not in source:
        problems.append(
            "_call_callback_hooks no longer looks hooks up on the instance and skips non-callables."
        )
    return problems + _log_move_problems()


def _log_move_problems() -> list[str]:
    from lightning.pytorch.trainer.connectors.logger_connector import result

    log = inspect.getsource(result._ResultCollection.log)
    to = inspect.getsource(getattr(result._ResultMetric.to, "__wrapped__", result._ResultMetric.to))
    problems = []
    if "self[key].to(value.device)" not in log:
        problems.append("_ResultCollection.log no longer moves the stored value with .to(value.device).")
    if "apply_to_collection(d, (Tensor, Metric), move_data_to_device" not in to:
        problems.append("_ResultMetric.to no longer only moves tensors and metric objects.")
    return problems
