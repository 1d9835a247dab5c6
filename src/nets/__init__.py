"""Plain `nn.Module`s that know nothing of Lightning: lift them out and use them anywhere."""

from typing import Any, Protocol, runtime_checkable

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from src.nets.mlp import MLP


@runtime_checkable
class Ensemble(Protocol):
    """A net of several members in one (:class:`MLP` with ``ensemble_size``): while training it returns
    each member's output, ``(B, ensemble_size, ...)``, so that each member is trained on every row (the
    task averages their losses); in evaluation it returns their mean, ``(B, ...)``, as any net would."""

    ensemble_size: int


#: the net of a task given none (``model.init_args.net`` left out), as a config: an ensemble of 8 MLPs
#: sharing two hidden layers of 128, each input embedded periodically; on the tables benchmark it is level
#: with the better of gradient boosting and a linear model (benchmarks/results/tables.md)
DEFAULT_NET: dict[str, Any] = {
    "class_path": "src.nets.MLP",
    "init_args": {"hidden_sizes": [128, 128], "ensemble_size": 8},
}


def shard(net: nn.Module, mesh: DeviceMesh) -> None:
    """FSDP2 on ``mesh``: each Linear its own group (its parameters gathered just before use), then the
    rest of the net; a net sharded already (``configure_model`` runs for every stage) is left alone."""
    if isinstance(net, FSDPModule):
        return
    for layer in net.modules():
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)


__all__ = ["DEFAULT_NET", "MLP", "Ensemble", "shard"]
