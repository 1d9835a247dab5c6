"""Two DDP processes on CPU (gloo), launched as a user would: by Lightning itself or by torchrun. SIGTERM,
Ctrl-C, a killed rank, a killed launcher and a taken port each end every process within seconds, with one
sentence per process saying what was saved, and no traceback of the run's own; what each leaves goes on
with the same command to the uninterrupted run's end.

Each run is a subprocess (plain ``ddp`` inside pytest would start pytest again), bounded by a timeout so
that a hang fails instead of blocking; ``tests.helpers.SignalAt`` sends the signal at a chosen step and
leaves each rank's process id for the test to watch.
"""

import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from src.extras.resume.test_cuts import busy  # noqa: F401  # a fixture
from tests.conftest import BARE, CONFIGS, ONE_PASS, QUIET
from tests.test_distributed import TRAINER, B, free_port, launch_env

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc, sends POSIX signals"
)

STEP = 10  # the step under way when the signal comes: 7 steps an epoch, so in the middle of epoch 1
WORDS = [
    "fit", "--config", str(CONFIGS / "spiral.yaml"), "--config", str(TRAINER / "ddp.yaml"), *BARE,
    "--data.num_samples=300", f"--data.batch_size={B}", *ONE_PASS, "--trainer.max_epochs=50",
    "--trainer.num_sanity_val_steps=0", "--resume=src.extras.resume.Resume",
    # last.ckpt every 4 steps, so that a lost process leaves one behind
    "--last_checkpoint=lightning.pytorch.callbacks.ModelCheckpoint", "--last_checkpoint.filename=last",
    "--last_checkpoint.every_n_train_steps=4", "--last_checkpoint.enable_version_counter=false", *QUIET,
]  # fmt: skip
TIMEOUT = 240  # two processes starting on a busy CPU take most of it; a hang takes all of it


def fault(
    folder: Path, rank: int = 0, name: str = "SIGTERM", parent: bool = False, step: int = STEP,
    delay: float = 0.0, group: bool = False,
) -> list[str]:  # fmt: skip
    """The words that send signal ``name`` ``delay`` seconds into step ``step`` from ``rank``, to itself, its
    parent or its process group (as a terminal sends Ctrl-C)."""
    return [
        "--trainer.callbacks+=tests.helpers.SignalAt", f"--trainer.callbacks.step={step}",
        f"--trainer.callbacks.folder={folder}", f"--trainer.callbacks.rank={rank}",
        f"--trainer.callbacks.name={name}", f"--trainer.callbacks.parent={parent}",
        f"--trainer.callbacks.delay={delay}", f"--trainer.callbacks.group={group}",
    ]  # fmt: skip


def running(folder: Path) -> list[int]:
    """The processes of the run in ``folder``: every rank and launcher has it in its command line, and each
    process they start (a worker) has it as its working folder."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError, PermissionError):
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            cwd = Path("/")
        started_there = cwd == folder or folder in cwd.parents  # a worker process the run started
        if state != "Z" and (started_there or any(str(folder).encode() in word for word in words)):
            pids.append(int(entry.name))  # (a zombie has ended)
    return pids


def launch(folder: Path, command: list[str], **env: str) -> tuple[int, str, float]:
    """Runs ``command`` in ``folder`` until it and every process it started have ended: its exit status,
    the output of all of them, and the seconds from the signal (its file written, else training under way:
    the first rank's process id written) to the last one's end. Whatever still runs after :data:`TIMEOUT`
    is killed."""
    launched = time.time()
    log = (folder / "output.txt").open("w")
    # a session of its own, as a terminal's job: a signal to its process group reaches none of the tests'
    process = subprocess.Popen(
        command, cwd=folder, env={**launch_env(), **env}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + TIMEOUT
    try:
        while (process.poll() is None or running(folder)) and time.monotonic() < deadline:
            time.sleep(0.2)
        ended = time.time()
        left = running(folder)
    finally:
        for pid in running(folder):
            os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            process.kill()
        process.wait()
        log.close()
    output = (folder / "output.txt").read_text()
    assert not left, f"processes {left} still ran {TIMEOUT} s after the launch:\n{output}"
    marks = list(folder.glob("signalled")) or list(folder.glob("pid*"))
    started = min((p.stat().st_mtime for p in marks), default=launched)
    return process.returncode, output, ended - started


def cli() -> list[str]:
    return [sys.executable, "-m", "src.cli"]


def torchrun() -> list[str]:
    port = free_port()
    return [
        str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node=2", "--master_addr=127.0.0.1",
        f"--master_port={port}", "-m", "src.cli",
    ]  # fmt: skip


def last_checkpoint(folder: Path) -> Path:
    (last,) = folder.rglob("last.ckpt")
    return last


def assert_no_traceback_of_the_run(output: str) -> None:
    # torchrun's own report of a signal it got (its last lines) is the launcher's, not the run's
    ours = re.split(r'Traceback \(most recent call last\):\n  File "[^"]*torchrun"', output)[0]
    assert "Traceback" not in ours, output
    assert "[rank" not in ours.replace("[rank: ", ""), output  # torch's prefix of a rank's traceback


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["lightning", "torchrun"])
def test_sigterm_saves_last_ckpt_on_every_rank_and_ends_every_process(tmp_path: Path, launcher: str) -> None:
    """Lightning's launcher is rank 0, which gets the signal; torchrun gets it itself and passes it on.
    Lightning's own handler would broadcast inside the signal handler, in the middle of whatever collective
    rank 0 was in, and the ranks would hang or abort."""
    if launcher == "lightning":
        code, output, seconds = launch(tmp_path, [*cli(), *WORDS, *fault(tmp_path)])
        assert code == 128 + signal.SIGTERM, output
    else:
        code, output, seconds = launch(tmp_path, [*torchrun(), *WORDS, *fault(tmp_path, parent=True)])
        assert code != 0, output  # torchrun's own status for a signal it got
    assert seconds < 30, output
    last = last_checkpoint(tmp_path)
    saved = torch.load(last, weights_only=True)
    assert saved["global_step"] == STEP + 1  # the step under way finished, on both ranks alike
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["done"] == STEP + 1 - 7
    for rank in (0, 1):
        assert f"Stopped after step {STEP + 1} (rank {rank} of 2) by SIGTERM; saved " in output, output
    assert f"--ckpt_path {last.relative_to(tmp_path)}" in output
    assert_no_traceback_of_the_run(output)


@pytest.mark.slow
def test_the_ddp_sigterm_save_resumed_with_the_printed_command_equals_uninterrupted(tmp_path: Path) -> None:
    """Dropout on, DistributedSampler shuffling: stopped by SIGTERM in the middle of epoch 1 and resumed
    with the very command rank 0 printed, the run saves at step 20 what the uninterrupted run saves."""
    short = ["--trainer.max_epochs=3", "--model.init_args.net.init_args.dropout=0.2"]  # 21 steps
    (tmp_path / "stopped").mkdir()
    (tmp_path / "uninterrupted").mkdir()
    code, output, _ = launch(tmp_path / "stopped", [*cli(), *WORDS, *short, *fault(tmp_path / "stopped")])
    assert code == 128 + signal.SIGTERM, output
    (advice,) = [
        line for line in output.splitlines() if line.startswith(f"Stopped after step {STEP + 1} (rank 0")
    ]
    resume = shlex.split(advice.split("Resume with: python -m src.cli ", 1)[1])
    code, output, _ = launch(tmp_path / "stopped", [*cli(), *resume])
    assert code == 0, output
    code, output, _ = launch(tmp_path / "uninterrupted", [*cli(), *WORDS, *short])
    assert code == 0, output
    resumed = torch.load(last_checkpoint(tmp_path / "stopped"), weights_only=True)
    uninterrupted = torch.load(last_checkpoint(tmp_path / "uninterrupted"), weights_only=True)
    assert resumed["global_step"] == uninterrupted["global_step"] == 20  # last.ckpt every 4 steps
    torch.testing.assert_close(resumed["state_dict"], uninterrupted["state_dict"], rtol=0, atol=0)
    torch.testing.assert_close(resumed["optimizer_states"], uninterrupted["optimizer_states"], rtol=0, atol=0)


@pytest.mark.slow
def test_a_killed_rank_ends_the_launcher_in_one_sentence_naming_the_last_checkpoint(tmp_path: Path) -> None:
    code, output, seconds = launch(tmp_path, [*cli(), *WORDS, *fault(tmp_path, rank=1, name="SIGKILL")])
    assert code == 1, output
    assert seconds < 30, output
    last = last_checkpoint(tmp_path)
    assert torch.load(last, weights_only=True)["global_step"] == 8  # every 4 steps: the last before 10
    lines = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: rank 0 of 2 lost the other processes of the distributed run ("), output
    assert (
        f"nothing was saved after step {STEP}; the last checkpoint, {last.relative_to(tmp_path)}, is "
        in lines[0]
    )
    assert "resume with: python -m src.cli fit " in lines[0]
    assert_no_traceback_of_the_run(output)


@pytest.mark.slow
def test_a_killed_launcher_ends_the_orphaned_rank_in_one_sentence(tmp_path: Path) -> None:
    code, output, seconds = launch(tmp_path, [*cli(), *WORDS, *fault(tmp_path, rank=0, name="SIGKILL")])
    assert code == -signal.SIGKILL
    assert seconds < 30, output
    lines = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: rank 1 of 2 lost the other processes of the distributed run ("), output
    assert f"nothing was saved after step {STEP}; the last checkpoint, " in lines[0]
    assert_no_traceback_of_the_run(output)


@pytest.mark.slow
def test_torchrun_killed_stops_its_workers_with_a_checkpoint(tmp_path: Path) -> None:
    """Killed outright, torchrun passes nothing on: its workers notice that their parent is gone."""
    code, output, seconds = launch(
        tmp_path, [*torchrun(), *WORDS, *fault(tmp_path, name="SIGKILL", parent=True)]
    )
    assert code == -signal.SIGKILL
    assert seconds < 30, output
    # the parent is gone a moment after the kill: a step or two later, the same on both ranks
    step = torch.load(last_checkpoint(tmp_path), weights_only=True)["global_step"]
    assert step > STEP
    for rank in (0, 1):
        stopped = f"Stopped after step {step} (rank {rank} of 2) because its launcher is gone; saved "
        assert stopped in output, output
    assert_no_traceback_of_the_run(output)


@pytest.mark.slow
def test_a_taken_rendezvous_port_is_one_sentence_and_leaves_no_rank_behind(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        code, output, seconds = launch(
            tmp_path, [*cli(), *WORDS, *fault(tmp_path)], MASTER_ADDR="127.0.0.1", MASTER_PORT=port
        )
    assert code == 1, output
    assert seconds < 90, output  # from the launch: Python's start and imports, then no wait
    lines = [line for line in output.splitlines() if line.startswith("error: ")]
    assert lines == [
        f"error: this process could not meet the other processes of the distributed run at 127.0.0.1:{port} "
        "(The server socket has failed to listen on any local network address); free that port or choose "
        "another (MASTER_PORT, or torchrun's --master_port) and start again."
    ], output
    assert_no_traceback_of_the_run(output)
    assert not list(tmp_path.glob("pid*"))  # no rank got as far as training


# -- Ctrl-C, and a kill in the first minute, at random moments on a busy machine ---------------------------

#: dropout on, 4 epochs: 28 steps in 2 processes, 56 in one
SHORT = ["--trainer.max_epochs=4", "--model.init_args.net.init_args.dropout=0.2"]


def shipped(processes: int, *more: str) -> list[str]:
    """The spiral run of :data:`WORDS` in ``processes`` processes, with the shipped callbacks: a best
    checkpoint at each epoch that improves val/loss, last.ckpt once a minute and at the end, the baselines
    in worker processes, figures."""
    ddp = ["--config", str(TRAINER / "ddp.yaml")] if processes == 2 else []
    return [
        "fit", "--config", str(CONFIGS / "spiral.yaml"), *ddp, "--data.num_samples=300",
        f"--data.batch_size={B}", *ONE_PASS, "--trainer.num_sanity_val_steps=0", *SHORT, *more, *QUIET,
    ]  # fmt: skip


def assert_same_state(resumed: Path, uninterrupted: Path) -> None:
    """The two checkpoints hold the same step, weights and optimizer state, to the bit."""
    got, expected = torch.load(resumed, weights_only=True), torch.load(uninterrupted, weights_only=True)
    assert got["global_step"] == expected["global_step"]
    torch.testing.assert_close(got["state_dict"], expected["state_dict"], rtol=0, atol=0)
    torch.testing.assert_close(got["optimizer_states"], expected["optimizer_states"], rtol=0, atol=0)


@pytest.fixture
def sigint_heard() -> Iterator[None]:
    """The runs start with SIGINT handled, as a terminal's foreground job does (a test run started in the
    background ignores SIGINT, and so would the processes it starts)."""
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
@pytest.mark.usefixtures("busy", "sigint_heard")
@pytest.mark.parametrize("processes", [2, 1])
def test_ctrl_c_at_random_moments_saves_once_and_the_printed_command_resumes_exactly(
    tmp_path: Path, processes: int
) -> None:
    """SIGINT to the run's whole process group, as a terminal sends Ctrl-C, at a random moment after the
    first step (a step, a validation, a checkpoint write): every process stops at the same step's end,
    last.ckpt is written once and whole, each says so, the exit status is 130 and nothing is left running;
    the command printed goes on to the uninterrupted run's final state."""
    words = shipped(processes)
    (tmp_path / "uninterrupted").mkdir()
    code, output, _ = launch(tmp_path / "uninterrupted", [*cli(), *words])
    assert code == 0, output
    uninterrupted = last_checkpoint(tmp_path / "uninterrupted")
    steps = torch.load(uninterrupted, weights_only=True)["global_step"]
    rng = random.Random(55 + processes)
    for trial in range(10):
        folder = tmp_path / f"ctrl_c{trial}"
        folder.mkdir()
        # a step after the first, and up to a few steps' time into it; the fit's last steps left to stop in
        step, delay = rng.randrange(1, steps - 2), rng.uniform(0.0, 0.05)
        moment = fault(folder, name="SIGINT", step=step, delay=delay, group=True)
        code, output, seconds = launch(folder, [*cli(), *words, *moment])
        assert code == 128 + signal.SIGINT, output
        assert seconds < 30, output
        last = last_checkpoint(folder)
        stopped = torch.load(last, weights_only=True)["global_step"]  # whole: it loads
        assert step < stopped <= steps, output  # (at the fit's end: a signal during its last validation)
        who = [f"after step {stopped} (rank {rank} of 2) by" for rank in (0, 1)]
        said = [f"Stopped {each} Ctrl-C (SIGINT); saved " for each in who]
        if processes == 1:
            said = [f"Stopped by Ctrl-C (SIGINT) after step {stopped}; saved "]
        for sentence in said:
            assert output.count(sentence) == 1, output
        assert "KeyboardInterrupt" not in output, output
        assert_no_traceback_of_the_run(output)
        (advice,) = [line for line in output.splitlines() if line.startswith(said[0])]
        resume = shlex.split(advice.split("Resume with: python -m src.cli ", 1)[1])
        code, output, _ = launch(folder, [*cli(), *resume])
        assert code == 0, output
        assert_same_state(last, uninterrupted)
        print(f"Ctrl-C {delay:.3f} s into step {step}: stopped after step {stopped} in {seconds:.1f} s")


@pytest.mark.slow
@pytest.mark.usefixtures("sigint_heard")
def test_ctrl_c_under_torchrun_stops_every_worker_saved(tmp_path: Path) -> None:
    """torchrun passes the Ctrl-C it gets on to its workers, which got it too: each notes it, and they stop
    together at a step's end as in a launch of Lightning's (torchrun's status and report are its own)."""
    moment = fault(tmp_path, name="SIGINT", group=True)
    code, output, seconds = launch(tmp_path, [*torchrun(), *WORDS, *moment])
    assert code != 0, output
    assert seconds < 30, output
    saved = torch.load(last_checkpoint(tmp_path), weights_only=True)
    assert saved["global_step"] == STEP + 1
    for rank in (0, 1):
        stopped = f"Stopped after step {STEP + 1} (rank {rank} of 2) by Ctrl-C (SIGINT); saved "
        assert output.count(stopped) == 1, output
    assert_no_traceback_of_the_run(output)


#: a named run that every start resumes with --ckpt_path last, as a requeued job does
REQUEUED = ["--trainer.logger.init_args.version=K", "--ckpt_path=last"]
#: the shipped checkpoints alone (a best one at each epoch that improves val/loss, last.ckpt at the end
#: and once its time has passed: here a time past the run's, the first minute of a run on a machine of any
#: load) and this extra: a killed process's workers (the baselines', the figures') live on until their
#: idle timeout, and would count as left running
CHECKPOINTS = [
    *BARE, "--best_checkpoint=lightning.pytorch.callbacks.ModelCheckpoint",
    "--best_checkpoint.init_args.monitor=val/loss", "--best_checkpoint.init_args.filename=best-{step}",
    "--last_checkpoint=src.callbacks.LatestCheckpoint", "--last_checkpoint.init_args.every_seconds=3600",
    "--resume=src.extras.resume.Resume",
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.usefixtures("busy")
@pytest.mark.parametrize("processes", [1, 2])
def test_a_kill_in_the_first_minute_goes_on_from_the_newest_checkpoint_with_the_same_command(
    tmp_path: Path, processes: int
) -> None:
    """SIGKILL of the one process, or of one of two ranks, at a random moment after the first epoch and
    before the first last.ckpt (written once a minute): the same command (``--ckpt_path last``) goes on
    from the run's newest checkpoint, a best one, to the uninterrupted run's final state, refusing
    nothing."""
    words = shipped(processes, *CHECKPOINTS, *REQUEUED)
    (tmp_path / "uninterrupted").mkdir()
    code, output, _ = launch(tmp_path / "uninterrupted", [*cli(), *words])
    assert code == 0, output
    uninterrupted = last_checkpoint(tmp_path / "uninterrupted")
    steps = torch.load(uninterrupted, weights_only=True)["global_step"]
    rng = random.Random(5500 + processes)
    for trial in range(3):
        folder = tmp_path / f"kill{trial}"
        folder.mkdir()
        step, delay = rng.randrange(steps // 4 + 1, steps - 2), rng.uniform(0.0, 0.05)
        kill = fault(folder, rank=processes - 1, name="SIGKILL", step=step, delay=delay)
        code, output, seconds = launch(folder, [*cli(), *words, *kill])
        assert code == (1 if processes == 2 else -signal.SIGKILL), output
        assert seconds < 30, output
        run = folder / "logs" / "spiral" / "K" / "checkpoints"
        # killed before its first last.ckpt; nor does rank 0 write one once it has lost rank 1 (a save then
        # could hold a validation half run), and its one sentence says so
        assert not (run / "last.ckpt").exists(), output
        if processes == 2:
            errors = [line for line in output.splitlines() if line.startswith("error: ")]
            assert len(errors) == 1, output
            assert errors[0].startswith("error: rank 0 of 2 lost the other processes of the distributed run")
            assert "; nothing was saved after step " in errors[0], output
        newest = max(run.glob("best-*.ckpt"), key=lambda path: torch.load(path)["global_step"])
        code, output, _ = launch(folder, [*cli(), *words])
        assert code == 0, output
        assert "error" not in output, output
        said = f"--ckpt_path last finds no last.ckpt in {run.relative_to(folder)}: this fit goes on from "
        assert f"{said}its newest checkpoint, {newest.name} " in output, output
        assert_same_state(run / "last.ckpt", uninterrupted)
        print(f"SIGKILL {delay:.3f} s into step {step}: went on from {newest.name} to step {steps}")
