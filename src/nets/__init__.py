"""Plain `nn.Module`s that know nothing of Lightning: lift them out and use them anywhere."""

from typing import Any

from src.nets.mlp import MLP

#: the net of a task given none (``model.init_args.net`` left out), as a config: an ensemble of 8 MLPs
#: sharing two hidden layers of 128, each input embedded periodically; on the tables benchmark it is level
#: with the better of gradient boosting and a linear model (benchmarks/results/tables.md)
DEFAULT_NET: dict[str, Any] = {
    "class_path": "src.nets.MLP",
    "init_args": {"hidden_sizes": [128, 128], "ensemble_size": 8},
}

__all__ = ["DEFAULT_NET", "MLP"]
