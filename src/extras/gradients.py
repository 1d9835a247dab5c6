"""The total L2 norm of an optimizer step's gradients, taken once however many callbacks read it."""

import weakref

import torch
from torch.distributed.tensor import DTensor

#: the last step's norm: (its optimizer, its ``trainer.global_step``, its gradients, their norm); weak
#: references, so that gradients set to None or zeroed away are freed as without it
_last: (
    tuple[weakref.ref[torch.optim.Optimizer], int, list[weakref.ref[torch.Tensor]], torch.Tensor] | None
) = None


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all ``grads`` together, a 0-d tensor in their dtype. Under FSDP2 the gradients are
    sharded: the shards' norms are gathered, on every process (a collective: each one must call it)."""
    norm = torch.nn.utils.get_total_norm(grads)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def step_norm(grads: list[torch.Tensor], optimizer: torch.optim.Optimizer, step: int) -> torch.Tensor:
    """:func:`total_norm` of the gradients ``optimizer`` is about to use at ``step``
    (``trainer.global_step``), taken by the first caller in ``on_before_optimizer_step`` and reused by the
    next ones.

    Reused only for the same optimizer and step and the very same gradient tensors in the same order
    (the order changes the float sum), so a caller that sees other gradients (the guard dropped them, or
    it reads the module's gradients where the other reads one optimizer's) gets their own norm. Values
    written into the same tensors between two callers of one step are not seen: the callers must come
    before anything that changes the gradients in place (clipping does so after every callback).
    """
    global _last
    last = _last
    if (
        last is not None
        and last[0]() is optimizer
        and last[1] == step
        and len(last[2]) == len(grads)
        and all(ref() is grad for ref, grad in zip(last[2], grads, strict=True))
    ):
        return last[3]
    norm = total_norm(grads)
    _last = (weakref.ref(optimizer), step, [weakref.ref(grad) for grad in grads], norm)
    return norm
