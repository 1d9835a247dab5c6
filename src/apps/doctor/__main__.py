"""``python -m src.apps.doctor [fit] --config ... [--key value ...]``: the checks, one line per finding.

Exit status 1 when something is wrong, 0 when all is clean (2 for a config the CLI refuses).
"""

import logging
import sys
import time

from src.apps.doctor.probe import examine
from src.cli import main as cli


def main(args: list[str] | None = None) -> int:
    """Build the configured run as ``fit`` would, examine it, print the findings; the exit status."""
    words = list(sys.argv[1:] if args is None else args)
    if words[:1] == ["fit"]:
        words = words[1:]  # the words of `python -m src.cli fit ...` work unchanged
    run = cli(words, run=False)
    started = time.perf_counter()
    # the probes' Trainers would each announce the devices again
    lightning_log = logging.getLogger("lightning.pytorch")
    level = lightning_log.level
    lightning_log.setLevel(logging.WARNING)
    try:
        findings = examine(run.model, run.datamodule, run.trainer)
    finally:
        lightning_log.setLevel(level)
    for finding in findings:
        print(finding.line())
    took = time.perf_counter() - started
    print(f"doctor: {len(findings) or 'no'} finding{'s' * (len(findings) != 1)} ({took:.1f} s of checks)")
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
