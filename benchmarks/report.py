"""What every benchmark table is printed with: where and with what it was measured, and where it is saved."""

import datetime
import os
import platform
from pathlib import Path

import lightning
import torch

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    """The CPU's marketing name as the kernel reports it, or the architecture where it does not."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: the other work that shared the cores while measuring."""
    try:
        return ", ".join(f"{load:.2f}" for load in os.getloadavg())
    except OSError:
        return "unknown"


def header(title: str) -> str:
    """A Markdown heading and the lines that make a table's numbers comparable with another's."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return "\n".join(
        [
            f"## {title}",
            "",
            f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='minutes')}",
            f"- machine: {cpu_model()}, {cores} cores usable ({os.cpu_count()} online), {platform.system()}",
            f"- python {platform.python_version()}, torch {torch.__version__}, "
            f"lightning {lightning.__version__}",
            f"- load average when the table was made (1, 5, 15 min): {load_average()}",
        ]
    )


def write(name: str, text: str) -> Path:
    """Save ``text`` as ``benchmarks/results/<name>.md``; returns the path."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(text.rstrip("\n") + "\n")
    return path
