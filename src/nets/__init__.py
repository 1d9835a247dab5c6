"""Plain `nn.Module`s that know nothing of Lightning: lift them out and use them anywhere."""

from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from src.nets.mlp import MLP

#: the net of a task given none (``model.init_args.net`` left out), as a config: two hidden layers of 128
DEFAULT_NET: dict[str, Any] = {"class_path": "src.nets.MLP", "init_args": {"hidden_sizes": [128, 128]}}


def shard(net: nn.Module, mesh: DeviceMesh) -> None:
    """FSDP2 on ``mesh``, each Linear its own group; a net sharded already is left alone."""
    if isinstance(net, FSDPModule):
        return
    for layer in net.modules():
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)


__all__ = ["DEFAULT_NET", "MLP", "shard"]
