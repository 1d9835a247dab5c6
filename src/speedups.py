"""Speed-ups that lean on a dependency's internals: the one module allowed to, each with an off switch.

Everything else in ``src/`` keeps to documented APIs (``tests/test_private_api.py`` holds it to that).
A trick that needs an internal lives here instead, and says three things: the internal it relies on,
why it is worth it, and the upstream change that would make it unnecessary. :func:`canary` checks each
internal is still what the trick assumes, so a Lightning upgrade that changes one fails
``tests/test_speedups.py`` rather than silently slowing, or breaking, a run.
"""

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
    """

    def __init__(self, skip_no_op_batch_hooks: bool = True) -> None:
        self.skip_no_op_batch_hooks = skip_no_op_batch_hooks

    def apply(self, callbacks: "Iterable[Callback]") -> None:
        """Apply the enabled tricks to ``callbacks``, before the Trainer runs with them."""
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
    return problems
