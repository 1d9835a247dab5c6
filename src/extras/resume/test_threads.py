"""torch's CPU threads hold the section's number for the run, and are given back after it, failed or not."""

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from src.cli import main
from src.errors import UserInputError
from src.extras.resume import Resume
from src.extras.resume.threads import CpuThreads
from tests.conftest import QUIET
from tests.test_cli import SMALL, TINY


class ThreadsDuringFit(Callback):
    seen: list[int]

    def on_train_batch_start(self, *args: object) -> None:
        self.seen.append(torch.get_num_threads())


@pytest.mark.parametrize("threads", [1, 3])
def test_cpu_threads_hold_for_the_run_and_are_restored(cli, threads: int) -> None:
    before = torch.get_num_threads()
    probe = ThreadsDuringFit()
    probe.seen = []
    run = main([*SMALL, *TINY, *QUIET, f"--resume.cpu_threads={threads}"], run=False)
    run.trainer.callbacks.append(probe)
    run.trainer.fit(run.model, datamodule=run.datamodule)
    assert probe.seen
    assert set(probe.seen) == {threads}
    assert torch.get_num_threads() == before


class Crash(Callback):
    def on_train_batch_start(self, *args: object) -> None:
        raise RuntimeError("crash")


def test_cpu_threads_are_restored_after_a_failed_run(cli) -> None:
    before = torch.get_num_threads()
    run = main([*SMALL, *TINY, *QUIET, f"--resume.cpu_threads={before + 1}"], run=False)
    run.trainer.callbacks.append(Crash())
    with pytest.raises(RuntimeError, match="crash"):
        run.trainer.fit(run.model, datamodule=run.datamodule)
    assert torch.get_num_threads() == before


def test_a_thread_count_below_one_is_one_sentence() -> None:
    with pytest.raises(UserInputError, match=r"cpu_threads threads=0 must be at least 1"):
        CpuThreads(threads=0)
    with pytest.raises(UserInputError, match=r"cpu_threads threads=0 must be at least 1"):
        Resume(cpu_threads=0)
