"""A timed fit on the GPU beside the same fit on the CPU: ``make gpu-check`` prints it after the CUDA tests.

    .venv/bin/python -m benchmarks.gpu_fit                 # digits, 30 epochs, on the GPU and the CPU
    .venv/bin/python -m benchmarks.gpu_fit --config configs/spiral.yaml --epochs 5

Each fit is ``make train``'s (the shipped callbacks on, the progress bar off), logging into a temporary
folder; the time is the whole ``trainer.fit`` call after the CLI built everything, after one unmeasured
fit of one epoch on the same device. Printed per device: seconds, optimizer steps per second, and on the
GPU its peak memory.
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch

import src.cli

ROOT = Path(__file__).resolve().parent.parent


def fit(config: str, epochs: int, accelerator: str, folder: Path) -> tuple[float, int]:
    words = [
        f"--config={config}", f"--trainer.max_epochs={epochs}", f"--trainer.accelerator={accelerator}",
        f"--trainer.logger.init_args.save_dir={folder}", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", "--early_stopping=null",
    ]  # fmt: skip
    cli = src.cli.main(words, run=False)
    start = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    if accelerator == "gpu":
        torch.cuda.synchronize()
    return time.perf_counter() - start, cli.trainer.global_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "digits.yaml"))
    parser.add_argument("--epochs", type=int, default=30)
    options = parser.parse_args()
    devices = ["gpu", "cpu"] if torch.cuda.is_available() else ["cpu"]
    if len(devices) == 1:
        print("No CUDA device here: the CPU fit only.")
    with tempfile.TemporaryDirectory(prefix="gpu-fit-") as tmp:
        for accelerator in devices:
            fit(options.config, 1, accelerator, Path(tmp))  # warm-up: kernels, caches, imports
            if accelerator == "gpu":
                torch.cuda.reset_peak_memory_stats()
            seconds, steps = fit(options.config, options.epochs, accelerator, Path(tmp))
            memory = (
                f", peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"
                if accelerator == "gpu"
                else ""
            )
            name = torch.cuda.get_device_name() if accelerator == "gpu" else "CPU"
            print(
                f"{name}: {seconds:.2f} s for {steps} optimizer steps ({steps / seconds:.0f} steps/s){memory}"
            )


if __name__ == "__main__":
    main()
