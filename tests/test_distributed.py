"""DDP on CPU (gloo): replicas stay identical, 2 x B equals 1 x 2B, epoch metrics are global, 2 nodes work.

In-process runs use ``ddp_spawn``: plain ``ddp`` would start pytest again as rank 1. The two-node run
launches the CLI with ``torchrun``, as on a cluster, because that launch is what is under test.
"""

import os
import runpy
import socket
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, DistributedSampler
from typing_extensions import override

from src.cli import CLI, main
from src.data.arrays import ArrayDataModule
from src.data.loading import keep_batch
from tests.conftest import BARE, CONFIGS, ONE_PASS, QUIET, ROOT

TRAINER = CONFIGS / "trainer"
SEED = 42  # defaults.yaml's seed_everything; Lightning's DistributedSampler is seeded with it
B = 15  # per process; spiral with 300 rows gives 210 training rows (7 x 2B) and 30 validation rows (2 x B)
SPIRAL = [
    "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=300", *ONE_PASS, "--trainer.max_epochs=2",
    "--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.init_args.lr=0.1",
    "--model.init_args.optimizer.init_args.weight_decay=0", "--trainer.num_sanity_val_steps=0",
    *BARE, "--trainer.logger=false", "--trainer.enable_checkpointing=false",
]  # fmt: skip


class RankReport(Callback):
    """Each process saves its final weights, the logged val/loss and the val loss of its own rows alone."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        total, count = torch.tensor(0.0), 0
        with torch.no_grad():
            for x, y in trainer.val_dataloaders:  # this process's share of the validation rows
                total += F.cross_entropy(pl_module(x), y, reduction="sum")
                count += len(y)
        report = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "weights": {k: v.detach().clone() for k, v in pl_module.state_dict().items()},
            "logged_val_loss": trainer.callback_metrics["val/loss"].clone(),
            "own_val_loss": total / count,
            "own_val_rows": count,
        }
        torch.save(report, self.folder / f"rank{trainer.global_rank}.pt")


class SameOrderAsTwoProcesses(ArrayDataModule):
    """One process, batches of 2B in the order that two DDP processes together see them.

    A ``DistributedSampler`` gives rank ``r`` the positions ``r::2`` of one seeded permutation per epoch,
    so step ``t`` of both ranks together covers positions ``[2Bt, 2B(t+1))``: the same permutation,
    drawn by a one-replica ``DistributedSampler``, cut into batches of 2B.
    """

    @override
    def train_dataloader(self) -> DataLoader:
        dataset = super().train_dataloader().dataset
        sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=SEED)
        return DataLoader(dataset, batch_size=2 * B, sampler=sampler, collate_fn=keep_batch)


def build(*args: str) -> CLI:
    return main([*SPIRAL, *args, *QUIET], run=False)


def test_ddp_two_processes_equal_one_process_with_twice_the_batch(workdir: Path) -> None:
    two = build(
        "--config", str(TRAINER / "ddp.yaml"), "--trainer.strategy=ddp_fork", f"--data.batch_size={B}"
    )
    assert two.trainer.world_size == 2
    two.trainer.callbacks.append(RankReport(workdir))
    two.trainer.fit(two.model, datamodule=two.datamodule)
    ranks = [torch.load(workdir / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world_size"] == 2 for r in ranks)

    # the replicas end bit-identical: same start (broadcast), same averaged gradients
    for name, tensor in ranks[0]["weights"].items():
        assert torch.equal(tensor, ranks[1]["weights"][name]), name

    one = build(f"--data.batch_size={2 * B}")
    # the same data arguments (the CLI adds a private _instantiator entry to hparams)
    arguments = {k: v for k, v in one.datamodule.hparams.items() if not k.startswith("_")}
    datamodule = SameOrderAsTwoProcesses(**arguments)
    one.trainer.fit(one.model, datamodule=datamodule)
    assert one.trainer.global_step == ranks[0]["global_step"] == 2 * 7
    # mean of two means of B rows == mean of 2B rows, up to float32 rounding; 14 SGD steps keep the
    # difference far below 1e-5
    reference = {k: v for k, v in one.model.state_dict().items() if k in ranks[0]["weights"]}
    torch.testing.assert_close(ranks[0]["weights"], reference, rtol=1e-5, atol=1e-6)

    # val/loss is a MeanMetric, synced once at compute: every rank logs the mean over all 30 rows, which
    # the one-process run computes directly; each rank's own 15 rows give another number
    assert [r["own_val_rows"] for r in ranks] == [B, B]
    assert not torch.isclose(ranks[0]["own_val_loss"], ranks[1]["own_val_loss"])
    global_mean = (ranks[0]["own_val_loss"] + ranks[1]["own_val_loss"]) / 2  # equal shares
    for report in ranks:
        torch.testing.assert_close(report["logged_val_loss"], global_mean)
    torch.testing.assert_close(one.trainer.callback_metrics["val/loss"], global_mean, rtol=1e-5, atol=1e-6)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_env() -> dict[str, str]:
    """The environment for a fresh launch: the project importable, no leftovers of an earlier one."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for key in [k for k in env if k.startswith(("PL_", "MASTER_", "LOCAL_RANK", "RANK", "WORLD_SIZE"))]:
        del env[key]
    return env


def wait_all(processes: list[subprocess.Popen], timeout: float) -> list[int]:
    """Exit codes of all processes; any still running after ``timeout`` seconds is killed."""
    try:
        return [process.wait(timeout=timeout) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.mark.slow  # the launcher itself; the processes' arithmetic is the ddp_fork test's
def test_two_nodes_with_torchrun_on_localhost(tmp_path: Path) -> None:
    """Two ``torchrun --nnodes=2`` launches, one process each, as two machines would run them."""
    port, env = free_port(), launch_env()
    launches = []
    for node in (0, 1):
        folder = tmp_path / f"node{node}"  # separate working folders, like separate machines
        folder.mkdir()
        command = [
            str(Path(sys.executable).parent / "torchrun"),
            "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1",
            "--master_addr=127.0.0.1", f"--master_port={port}",
            "-m", "src.cli", "fit",
            "--config", str(CONFIGS / "spiral.yaml"), "--config", str(TRAINER / "ddp.yaml"),
            "--trainer.devices=1", "--trainer.num_nodes=2",
            "--data.num_samples=300", f"--data.batch_size={B}", *ONE_PASS, "--trainer.max_epochs=1",
            *BARE, *QUIET,
        ]  # fmt: skip
        log = (folder / "output.txt").open("w")
        launches.append(
            (subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT), log)
        )
    try:
        codes = [process.wait(timeout=150) for process, _ in launches]
    finally:
        for process, log in launches:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    outputs = [(tmp_path / f"node{n}" / "output.txt").read_text() for n in (0, 1)]
    assert codes == [0, 0], "\n\n".join(outputs)

    # rank 0 (node 0) writes logs and checkpoints; node 1 writes nothing
    (checkpoint,) = (tmp_path / "node0").rglob("*.ckpt")  # Lightning's default ModelCheckpoint
    assert not list((tmp_path / "node1").rglob("*.ckpt"))
    # each node trained on half of the 210 rows: 7 steps of B in the epoch, not 14
    assert torch.load(checkpoint, weights_only=True)["global_step"] == 210 // (2 * B)


@pytest.mark.slow
def test_fsdp2_shards_checkpoints_resumes_and_consolidates(tmp_path: Path, cli, workdir: Path) -> None:
    """FSDP2 through ModelParallelStrategy in 2 processes, then the checkpoint in 1 process."""
    fsdp2_round_trip(tmp_path, cli, workdir)


def fsdp2_round_trip(tmp_path: Path, cli, workdir: Path, *callbacks: str) -> None:
    """The FSDP2 test's runs, with ``callbacks`` (section words after BARE) on in each: a plug-in's callback
    is held to the same proofs on sharded (DTensor) gradients and weights in its own folder."""
    words = [
        "--config", str(CONFIGS / "spiral.yaml"), "--config", str(TRAINER / "fsdp.yaml"),
        "--data.num_samples=300", "--data.batch_size=32", *ONE_PASS, *BARE, *callbacks, *QUIET,
        # Linear layers only: the periodic embedding's frequencies sit in the root group, which FSDP2 leaves
        # gathered after a forward, so its shard could not be compared at the resumed fit's start
    ]  # fmt: skip
    command = [
        str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        str(ROOT / "tests" / "torchrun_fsdp.py"), str(tmp_path), *words,
    ]  # fmt: skip
    with (tmp_path / "output.txt").open("w") as log:
        process = subprocess.Popen(
            command, cwd=workdir, env=launch_env(), stdout=log, stderr=subprocess.STDOUT
        )
    assert wait_all([process], timeout=200) == [0], (tmp_path / "output.txt").read_text()
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]

    # every parameter is sharded; each rank holds about half of them (rows split as evenly as they go)
    first = [r["first_end"] for r in ranks]
    assert all(f["sharded"] for f in first)
    assert first[0]["local_numel"] + first[1]["local_numel"] == first[0]["full_numel"]
    for f in first:
        assert 0.4 < f["local_numel"] / f["full_numel"] < 0.6

    # the resumed fit starts from the saved shards and Adam moments, on each rank, and goes on
    for r in ranks:
        torch.testing.assert_close(r["resumed_start"]["params"], r["first_end"]["params"], rtol=0, atol=0)
        assert r["first_end"]["exp_avg"]
        torch.testing.assert_close(r["resumed_start"]["exp_avg"], r["first_end"]["exp_avg"], rtol=0, atol=0)
        steps_per_epoch = r["first_end"]["global_step"] // 2
        assert r["resumed_start"]["global_step"] == r["first_end"]["global_step"]
        assert r["resumed_end"]["global_step"] == r["first_end"]["global_step"] + steps_per_epoch

    # a folder of shards becomes one file, with Lightning's own tool, as a user would run it
    folder = Path(workdir / ranks[0]["checkpoint"])
    assert folder.is_dir()
    single = tmp_path / "consolidated.ckpt"
    argv = ["consolidate_checkpoint", str(folder), "--output_file", str(single)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", argv)
        runpy.run_module("lightning.fabric.utilities.consolidate_checkpoint", run_name="__main__")
    consolidated = torch.load(single, weights_only=True)["state_dict"]
    for name, shard in first[0]["params"].items():
        # FSDP2 shards along dim 0: rank 0 holds the first rows, rank 1 the rest
        torch.testing.assert_close(consolidated[name], torch.cat([shard, first[1]["params"][name]]))

    # and loads in one process, without any strategy, for test and predict (the callbacks as in the
    # sharded run, whose checkpoint carries their state)
    base = [
        "--config", str(CONFIGS / "spiral.yaml"), "--data.num_samples=300", *ONE_PASS, *BARE, *callbacks,
        "--ckpt_path", str(single),
    ]  # fmt: skip
    tested = cli("test", *base)
    assert torch.isfinite(tested.trainer.callback_metrics["test/loss"])
    for name, tensor in tested.model.state_dict().items():
        if name in consolidated:
            torch.testing.assert_close(tensor, consolidated[name])
    predicted = cli("predict", *base)
    probs = torch.cat([batch["probs"] for batch in predicted.trainer.predict_loop.predictions])
    x_predicted = predicted.datamodule.dataset("predict").tensors[0]  # the validation rows
    with torch.no_grad():
        torch.testing.assert_close(probs, tested.model(x_predicted).softmax(-1))
