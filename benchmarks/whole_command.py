"""What a person waits for: the template's commands from Enter to exit, against the bare Lightning script.

    .venv/bin/python -m benchmarks.whole_command                        # both commands, 3 rounds, quiet
    .venv/bin/python -m benchmarks.whole_command --busy --rounds 5      # the other core kept busy
    .venv/bin/python -m benchmarks.whole_command --only "one epoch" --write

Each command runs as a whole process, timed by the wall clock from its start to its exit: the
interpreter's start, the imports, parsing, the data, the fit, what the extras do at its start and end,
the test, the interpreter's exit. Two commands, each against :mod:`benchmarks.bare_digits` doing the
same work:

- ``one epoch``: ``python -m src.cli fit --config configs/digits.yaml --trainer.max_epochs=1
  --trainer.enable_progress_bar=false`` against ``python -m benchmarks.bare_digits --max_epochs 1``;
- ``make train``: ``make train``'s command, ``python -m src.cli fit --config configs/digits.yaml
  --test_after_fit true`` (early stopping, then a test of the best checkpoint), against
  ``python -m benchmarks.bare_digits --test --max_epochs N --no-early_stopping``: the same epochs N as
  the template's run (its unmeasured first round runs first and says N), then the same test.

Both write their logs into a temporary folder; their output goes to a file. Each round runs the two in
turn, alternating which goes first, after one unmeasured round that fills the OS's file cache and
Python's bytecode cache. Reported: the median seconds of each, and the speed ratio, bare's time over
the template's (1.0: as fast as the bare script), from the medians, with its range over the rounds.
``--busy`` keeps one other core spinning (a Python loop in a process of its own) for the whole
measurement. The bare script uses torch's own thread count (one per core), as a script from the docs
does; ``--bare_threads 1`` gives it the one thread the template's fit uses (``resume.cpu_threads``), which
on a machine busy with other work is several times faster than one per core.

Every command starts a session of its own; the moment it exits, every process still in that session is
one it left running (a worker pool not shut down, say): they are counted and named, then ended, so that
they do not weigh on the next round.
"""

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # no py.typed; in requirements.lock through Lightning

from benchmarks import report

ROOT = Path(__file__).resolve().parent.parent
#: per command, the template's words and the bare script's, after ``python -m``
COMMANDS = {
    "one epoch": (
        ["src.cli", "fit", "--config", "configs/digits.yaml", "--trainer.max_epochs=1",
         "--trainer.enable_progress_bar=false"],
        ["benchmarks.bare_digits", "--max_epochs", "1"],
    ),
    "make train": (
        ["src.cli", "fit", "--config", "configs/digits.yaml", "--test_after_fit", "true"],
        ["benchmarks.bare_digits", "--test"],
    ),
}  # fmt: skip
#: the issue's goals: the template at least this share of the bare script's speed
GOALS = {"one epoch": 0.8, "make train": 0.9}
VARIANTS = ("template", "bare")


@dataclass
class Run:
    """One command's wall time, the processes of its session still there when it exited, its epochs."""

    seconds: float
    left: list[str]
    epochs: int | None


@dataclass
class Cell:
    """One command's runs, per variant, round by round."""

    runs: dict[str, list[Run]] = field(default_factory=lambda: {v: [] for v in VARIANTS})

    def median(self, variant: str) -> float:
        return statistics.median(run.seconds for run in self.runs[variant])

    def ratio(self) -> float:
        """The template's speed relative to the bare script's, from the medians."""
        return self.median("bare") / self.median("template")

    def ratios(self) -> list[float]:
        return [b.seconds / t.seconds for b, t in zip(self.runs["bare"], self.runs["template"], strict=True)]


def in_session(session: int) -> list[psutil.Process]:
    """The living processes of ``session`` (zombies, which have ended, aside)."""
    found = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getsid(process.pid) == session and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (ProcessLookupError, PermissionError):
            continue
    return found


def end(processes: list[psutil.Process]) -> None:
    """End the processes a measured command left (by their ids), so that they cost the next one nothing."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=5)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def name(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:120] or process.name()
    except psutil.Error:
        return "(ended)"


def epochs(output: str) -> int | None:
    """The epochs a run went through, from what it printed: the bare script's ``epochs: N``, the run
    summary's ``Fit ended: ... after N epochs`` or ``early stopping at epoch N`` (0-based: N + 1)."""
    if found := re.search(r"^epochs: (\d+)$", output, re.MULTILINE):
        return int(found[1])
    if found := re.search(r"Fit ended: .*?after (\d+) epochs", output):
        return int(found[1])
    if found := re.search(r"Fit ended: early stopping at epoch (\d+)", output):
        return int(found[1]) + 1
    return None


def command(words: list[str], logs: Path) -> list[str]:
    """``python -m <words>``, writing its logs under ``logs``."""
    save = "--trainer.logger.init_args.save_dir" if words[0] == "src.cli" else "--save_dir"
    return [sys.executable, "-m", *words, save, str(logs)]


def run(argv: list[str]) -> Run:
    """``argv`` in the repository's root, in a session of its own: its wall time from start to exit, and
    what it left running."""
    with tempfile.TemporaryFile("w+") as output:
        start = time.perf_counter()
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        code = process.wait()
        seconds = time.perf_counter() - start
        left = in_session(process.pid)
        names = [name(p) for p in left]
        end(left)
        output.seek(0)
        text = output.read()
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({code}):\n{text[-3000:]}")
    return Run(seconds, names, epochs(text))


@contextlib.contextmanager
def busy(on: bool) -> Iterator[None]:
    """With ``on``: one process spinning on a core while the block runs."""
    if not on:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.terminate()
        spinner.wait()


def measure(commands: list[str], rounds: int, spin: bool, bare_threads: int = 0) -> dict[str, Cell]:
    cells = {which: Cell() for which in commands}
    with busy(spin), tempfile.TemporaryDirectory(prefix="whole-command-") as folder:
        for which in commands:
            same: list[str] = []  # the bare script's words for the template's epochs (make train)
            for index in range(rounds + 1):  # round 0 fills the caches, unmeasured; the template first
                order = VARIANTS if index % 2 == 0 else VARIANTS[::-1]
                for variant in order:
                    words = COMMANDS[which][VARIANTS.index(variant)]
                    if variant == "bare":
                        words = [*words, *same, *(["--threads", str(bare_threads)] if bare_threads else [])]
                    done = run(command(words, Path(folder) / f"{variant}-{index}"))
                    if variant == "template" and which == "make train" and done.epochs and not same:
                        same = ["--max_epochs", str(done.epochs), "--no-early_stopping"]
                    if index:
                        cells[which].runs[variant].append(done)
                    left = f", left running: {len(done.left)}" if done.left else ""
                    print(f"{which} {index}/{rounds}: {variant} {done.seconds:.2f} s{left}", flush=True)
    return cells


def table(cells: dict[str, Cell], spin: bool, bare_threads: int = 0) -> str:
    load = "one other core kept busy" if spin else "nothing else started by the benchmark"
    threads = f"{bare_threads} torch thread(s)" if bare_threads else "torch's own thread count"
    lines = [
        f"Whole processes, start to exit ({load}); the bare script with {threads}; medians of "
        f"{len(next(iter(cells.values())).runs['bare'])} alternating rounds. Seconds.",
        "",
        "| command | template | bare script | bare / template (range) | goal | epochs (template, bare) | "
        "left running by the template |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    verdicts = []
    for command, cell in cells.items():
        ratios = cell.ratios()
        left = sorted({n for run in cell.runs["template"] for n in run.left})
        counts = [len(run.left) for run in cell.runs["template"]]
        said = f"{max(counts)}: " + "; ".join(left) if left else "none"
        seen = ", ".join(
            "/".join(str(r.epochs) if r.epochs is not None else "?" for r in cell.runs[v]) for v in VARIANTS
        )
        lines.append(
            f"| {command} | {cell.median('template'):.2f} | {cell.median('bare'):.2f} | {cell.ratio():.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}) | {GOALS[command]:.1f} | {seen} | {said} |"
        )
        verdicts.append(
            f"- {'PASS' if cell.ratio() >= GOALS[command] else 'FAIL'}: {command}, the template at "
            f"{cell.ratio():.2f}x the bare script's speed (goal {GOALS[command]}x)"
        )
        verdicts.append(f"- {'FAIL' if left else 'PASS'}: {command}, nothing left running after the command")
    return "\n".join([*lines, "", *verdicts])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per command (default 3)")
    parser.add_argument("--only", nargs="+", choices=list(COMMANDS), default=list(COMMANDS))
    parser.add_argument("--busy", action="store_true", help="keep one other core spinning")
    parser.add_argument(
        "--bare_threads",
        type=int,
        default=0,
        help="the bare script's torch threads; 0 (default): torch's own",
    )
    parser.add_argument("--write", action="store_true", help="also save results/whole_command.md")
    args = parser.parse_args()
    cells = measure(args.only, args.rounds, args.busy, args.bare_threads)
    text = report.header("Whole commands: the template against a bare Lightning script") + "\n\n"
    text += table(cells, args.busy, args.bare_threads)
    print(f"\n{text}")
    if args.write:
        print(f"\nwritten to {report.write('whole_command' + ('_busy' if args.busy else ''), text)}")


if __name__ == "__main__":
    main()
