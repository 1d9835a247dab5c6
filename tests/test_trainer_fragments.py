"""Every fragment in configs/trainer/ says how to stack it, and its values reach the resolved config.

tests/test_cli.py runs each fragment stacked on an experiment; the feature tests prove what each one does.
"""

from pathlib import Path

import pytest
import yaml

from src.cli import main
from tests.conftest import CONFIGS, QUIET

FRAGMENTS = sorted((CONFIGS / "trainer").glob("*.yaml"))
# building the Trainer of fp16.yaml on CPU: Lightning says it runs bf16-mixed instead (asserted in
# tests/test_precision.py)
pytestmark = pytest.mark.filterwarnings(
    "ignore:You passed `Trainer\\(accelerator='cpu', precision='16-mixed'\\)`:UserWarning"
)


def leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    """``{"trainer.precision": "bf16-mixed", ...}``; a list (callbacks) is one leaf."""
    flat: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and "class_path" not in value:
            flat.update(leaves(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=lambda p: p.name)
def test_fragment_opens_with_the_command_that_stacks_it(fragment: Path) -> None:
    command = f"python -m src.cli fit --config configs/digits.yaml --config configs/trainer/{fragment.name}"
    head = fragment.read_text().splitlines()[:3]
    assert any(command in line for line in head), f"{fragment.name} should show how to stack it"


@pytest.mark.slow
@pytest.mark.parametrize("fragment", FRAGMENTS, ids=lambda p: p.name)
def test_fragment_values_reach_the_parsed_config(fragment: Path, workdir: Path) -> None:
    """Stacked on digits.yaml, every value the fragment sets is what the CLI resolves."""
    run = main(["--config", str(CONFIGS / "digits.yaml"), "--config", str(fragment), *QUIET], run=False)
    config = run.config
    for key, value in leaves(yaml.safe_load(fragment.read_text())).items():
        resolved = config[key]
        if isinstance(value, dict):  # a class_path entry: the class and the arguments it names
            assert resolved.class_path == value["class_path"]
            for name, argument in value.get("init_args", {}).items():
                assert resolved.init_args[name] == argument, f"{key}.{name}"
        elif isinstance(value, list):
            assert [c.class_path for c in resolved] == [c["class_path"] for c in value]
        else:
            assert resolved == value, key
