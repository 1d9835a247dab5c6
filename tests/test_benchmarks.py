"""The core's benchmarks' machinery: what a whole command is timed from, what it left running, and a
verdict that follows from its numbers (the table kind's and the images' benchmarks: tested in their
folders). No timing is asserted: the machines that run the suite are shared and noisy."""

import os
import sys

# -- the whole command: what it times, and what it says a command left running ----------------------------


def test_a_command_that_leaves_a_process_running_is_named_and_the_process_ended() -> None:
    import psutil  # type: ignore[import-untyped]

    from benchmarks.whole_command import run

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)", str(os.getpid())]  # one of this test's
    left = run([sys.executable, "-c", f"import subprocess; subprocess.Popen({sleeper!r})"])
    assert left.left == [" ".join(sleeper)]
    assert 0 < left.seconds < 60  # the command's own exit, not the sleeper's
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == sleeper]  # ended
    tidy = run([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', '0'])"])
    assert tidy.left == []


def test_the_whole_commands_ratio_is_bare_over_template_and_a_leftover_fails_its_verdict() -> None:
    from benchmarks.whole_command import Cell, Run, epochs, table

    cell = Cell({"template": [Run(10.0, [], 1), Run(12.0, ["worker"], 1)],
                 "bare": [Run(9.0, [], 1), Run(6.0, [], 1)]})  # fmt: skip
    assert cell.ratios() == [0.9, 0.5]
    assert cell.ratio() == 7.5 / 11.0  # from the medians
    text = table({"one epoch": cell}, spin=False)
    assert "| one epoch | 11.00 | 7.50 | 0.68 (0.50-0.90) | 0.8 |" in text
    assert "- FAIL: one epoch, the template at 0.68x" in text
    assert "- FAIL: one epoch, nothing left running after the command" in text
    # the epochs each run went through, as it printed them
    assert epochs("epochs: 57\n") == 57
    assert epochs("Fit ended: early stopping at epoch 34 (max_epochs 60): ...") == 35
    assert epochs("Fit ended: reached trainer.max_epochs=1 after 1 epochs (20 steps).") == 1
