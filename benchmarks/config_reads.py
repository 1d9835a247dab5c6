"""How many times one command opens each config file (Python's audit events for ``open``): a fit of one
epoch on digits, then ``test`` of its checkpoint.

    python -m benchmarks.config_reads
"""

import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
opened: Counter[str] = Counter()


def audit(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and isinstance(args[0], str | Path) and str(args[0]).endswith((".yaml", ".yml")):
        opened[Path(str(args[0])).name] += 1


def main() -> None:
    sys.addaudithook(audit)
    from src.cli import main as cli

    quiet = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    configs = ["--config", "configs/digits.yaml", "--config", "configs/trainer/bare.yaml"]
    logs = f"--trainer.logger.init_args.save_dir={tempfile.mkdtemp()}"
    fit = cli(["fit", *configs, "--trainer.max_epochs=1", logs, *quiet])
    print("fit:", dict(opened))
    opened.clear()
    last = Path(str(fit.trainer.log_dir)) / "checkpoints"
    ckpt = sorted(last.glob("*.ckpt"))[-1]
    cli(["test", f"--ckpt_path={ckpt}", *quiet])
    print("test --ckpt_path:", dict(opened))


if __name__ == "__main__":
    main()
