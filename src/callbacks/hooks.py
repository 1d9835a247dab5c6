"""Per-batch hooks a callback leaves as ``Callback``'s no-ops, taken out of the Trainer's dispatch."""

from lightning.pytorch.callbacks import Callback

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


def skip_no_op_batch_hooks(callback: Callback) -> None:
    """Hide from the Trainer the per-batch hooks that ``callback``'s class does not override.

    Lightning calls every hook of every callback on every batch, whether the callback acts there or
    not: each call builds the callback's ``state_key`` (for a ModelCheckpoint a dict's repr), a name
    for the profiler and a profiler context, about 1 µs, so a training step with the shipped callbacks
    paid for some 60 calls of ``Callback``'s empty methods. The Trainer's dispatch
    (``lightning.pytorch.trainer.call._call_callback_hooks``) skips an attribute that is not callable,
    so each such hook is shadowed on the instance by ``None``; nothing else calls these hooks.
    Hooks the class overrides, itself or through a base other than ``Callback``, are left alone.
    """
    for name in BATCH_HOOKS:
        if getattr(type(callback), name) is getattr(Callback, name):
            setattr(callback, name, None)
