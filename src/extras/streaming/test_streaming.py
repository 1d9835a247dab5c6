"""The streaming DataModule keeps the in-memory path's promises: the same fitted preprocessing, a split by
a documented hash, every training row once per epoch across processes, and a resume bit for bit."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from sklearn.preprocessing import OneHotEncoder
from typing_extensions import override

from src.checkpoints import load_checkpoint
from src.cli import CLI, main
from src.errors import UserInputError
from src.extras.streaming import (
    CODE,
    SPLITS,
    SplitStream,
    StreamingTableDataModule,
    StreamLoader,
    infrequent,
    split_codes,
)
from src.extras.tables.datamodule import Columns, Encoding, preprocessing_of
from src.extras.tables.preprocessing import Location, Options, fit_preprocessor
from tests.conftest import BARE, CONFIGS, QUIET, ROOT
from tests.helpers import StopAt
from tests.test_distributed import free_port, launch_env, wait_all

CLASS = "src.extras.streaming.StreamingTableDataModule"

#: the streamed fit without scaling: its values are the file's, easier to compare
UNSCALED = Encoding(impute_strategy="mean", standardize=False)


def frame_of(rows: int = 600, seed: int = 0) -> pd.DataFrame:
    """Two spiral arms' worth of signal, with the cells that make fitting interesting: missing numbers
    (a column empty in its first rows), a constant column, text categories with rare and missing ones,
    and ``row_id``, the row's number, which the counting tests read back from the batches."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(3.0, 2.0, rows), rng.normal(0.0, 1.0, rows).astype(np.float32)
    sparse = rng.normal(10.0, 5.0, rows)
    sparse[:150] = np.nan
    sparse[rng.random(rows) < 0.2] = np.nan
    colour = rng.choice(
        ["red", "green", "blue", "grey", "pink", " red"], rows, p=[0.4, 0.3, 0.1, 0.1, 0.05, 0.05]
    )
    colour = pd.Series(colour, dtype=object).where(rng.random(rows) > 0.1, None)
    return pd.DataFrame({
        "row_id": np.arange(rows, dtype=np.float64),
        "a": a, "b": b, "const": 5.0, "sparse": sparse, "colour": colour,
        "label": np.where(a - 3 + b > 0, "up", "down"),
    })  # fmt: skip


def write_folder(folder: Path, frame: pd.DataFrame, files: int = 3, group_rows: int = 60) -> Path:
    """``frame`` as ``files`` Parquet files (``part-0.parquet``, ...) of row groups of ``group_rows``."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(len(frame)), files)):
        frame.iloc[part].reset_index(drop=True).to_parquet(
            folder / f"part-{i}.parquet", row_group_size=group_rows
        )
    return folder


def train_positions(data: StreamingTableDataModule) -> np.ndarray:
    """Positions of the training rows in the files' concatenation (file, then row order), by the rule."""
    codes = np.concatenate([split_codes(g, 42, 0.1, 0.2) for g in data.groups])
    return np.flatnonzero(codes == CODE["train"])


# -- the fitted preprocessing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        {"task": "classification", "encoding": {"missing_indicator": True, "max_categories": 4}},
        {
            "task": "regression",
            "encoding": {"standardize": False, "min_category_frequency": 30},
            "drop": ["label"],
        },
    ],
    ids=["classification", "regression"],
)
def test_the_one_pass_fit_equals_the_in_memory_fit(tmp_path: Path, settings: dict) -> None:
    frame = frame_of()
    target = "label" if settings["task"] == "classification" else "a"
    encoding = Encoding(impute_strategy="mean", **settings["encoding"])
    data = StreamingTableDataModule(
        str(write_folder(tmp_path / "rows", frame)), target, settings["task"], batch_size=16,
        columns=Columns(drop=settings.get("drop", [])), encoding=encoding,
    )  # fmt: skip
    streamed = data.preprocessor
    features = [c for c in frame.columns if c not in (target, "label")]
    numeric = [c for c in features if c != "colour"]
    train = train_positions(data)
    reference = fit_preprocessor(
        frame[features], train, (numeric, ["colour"], {}), settings["task"], target,
        frame[target].iloc[train], Options(impute_strategy="mean", **settings["encoding"]),
        Location("the rows"),
    )  # fmt: skip
    assert streamed.categorical == reference.categorical  # the same categories, "other" column, order
    assert streamed.labels == reference.labels
    assert [c.name for c in streamed.numeric] == [c.name for c in reference.numeric]
    for ours, theirs in zip(streamed.numeric, reference.numeric, strict=True):
        assert ours.indicator == theirs.indicator, ours.name
        for field in ("fill", "mean", "scale"):
            assert getattr(ours, field) == pytest.approx(getattr(theirs, field), rel=1e-12, abs=1e-12), (
                ours.name
            )
    assert streamed.feature_names == reference.feature_names
    # the fit saw more than one batch per column, a column without values in its first ones included
    assert len(data.groups) == 12
    assert streamed.numeric[-1].name == "sparse"


@pytest.mark.parametrize("max_categories", [2, 3, 4, 10])
@pytest.mark.parametrize("min_frequency", [1, 3, 5])
def test_the_rare_categories_from_counts_are_the_one_hot_encoders(
    max_categories: int, min_frequency: int
) -> None:
    counts = {"a": 5, "b": 3, "c": 5, "d": 1, "e": 3, "f": 7}  # ties on purpose
    values = np.array([[name] for name, n in counts.items() for _ in range(n)], dtype=object)
    encoder = OneHotEncoder(
        handle_unknown="infrequent_if_exist", max_categories=max_categories, min_frequency=min_frequency
    ).fit(values)
    rare = encoder.infrequent_categories_[0]
    assert infrequent(counts, max_categories, min_frequency) == (
        set(rare.tolist()) if rare is not None else set()
    )


# -- the split ------------------------------------------------------------------------------------------


def test_the_split_is_the_hash_rule_and_stays_put_when_files_are_added(tmp_path: Path) -> None:
    frame = frame_of(3000)
    folder = write_folder(tmp_path / "rows", frame, files=2, group_rows=500)
    before = StreamingTableDataModule(str(folder), "label", "classification")
    shares = before.counts.sum(axis=0) / 3000
    np.testing.assert_allclose(shares, [0.7, 0.1, 0.2], atol=0.02)  # the fractions, on average
    codes = {(g.name, g.index): split_codes(g, 42, 0.1, 0.2) for g in before.groups}
    frame_of(500, seed=1).to_parquet(folder / "part-2.parquet")  # appended later
    after = StreamingTableDataModule(str(folder), "label", "classification")
    for group in after.groups:
        if group.name != "part-2.parquet":
            np.testing.assert_array_equal(split_codes(group, 42, 0.1, 0.2), codes[group.name, group.index])
    assert len(after.groups) == len(before.groups) + 1
    # another seed, another split
    assert not np.array_equal(split_codes(before.groups[0], 7, 0.1, 0.2), codes["part-0.parquet", 0])


# -- the rows of an epoch -------------------------------------------------------------------------------


def stream_ids(
    data: StreamingTableDataModule, rank: int, world: int, seed: int, skip: int = 0
) -> list[list[int]]:
    """The ``row_id`` of each row of each batch that process ``rank`` of ``world`` gets (unstandardized)."""
    hp = data.settings
    stream = SplitStream(
        data.groups, data.counts[:, CODE["train"]],
        lambda numbers, shuffle: data.encode_window(numbers, "train", shuffle), "train", hp.batch_size,
        hp.shuffle_row_groups, rank, world, hp.drop_last,
    )  # fmt: skip
    stream.epoch_seed, stream.skip = seed, skip
    column = data.preprocessor.feature_names.index("row_id")
    return [x[:, column].long().tolist() for x, _ in stream]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_training_row_once_per_epoch_in_equal_batch_counts(
    tmp_path: Path, world: int, drop_last: bool
) -> None:
    data = StreamingTableDataModule(
        str(write_folder(tmp_path / "rows", frame_of())), "label", "classification",
        encoding=UNSCALED, batch_size=32, shuffle_row_groups=3, drop_last=drop_last,
    )  # fmt: skip
    train = train_positions(data)
    per_rank = [stream_ids(data, rank, world, seed=1234) for rank in range(world)]
    assert len({len(batches) for batches in per_rank}) == 1  # no process waits for a batch
    seen = [i for batches in per_rank for batch in batches for i in batch]
    if drop_last:
        assert all(len(batch) == 32 for batches in per_rank for batch in batches)
        assert set(seen) <= set(train.tolist())
        assert len(seen) == len(set(seen))
        assert len(train) - len(seen) < world * 32
    else:
        assert sorted(seen) == train.tolist()  # each training row exactly once
    # the rows are shuffled, across row groups, and the next epoch's order is another
    first = [i for batch in stream_ids(data, 0, 1, seed=1234) for i in batch]
    assert first != sorted(first)
    assert first != [i for batch in stream_ids(data, 0, 1, seed=99) for i in batch]


def test_a_skipped_epoch_goes_on_with_the_same_batches(tmp_path: Path) -> None:
    data = StreamingTableDataModule(
        str(write_folder(tmp_path / "rows", frame_of())),
        "label",
        "classification",
        encoding=UNSCALED,
        batch_size=16,
    )
    whole = stream_ids(data, 0, 1, seed=5)
    for skip in (1, 7, len(whole) - 1):
        assert stream_ids(data, 0, 1, seed=5, skip=skip) == whole[skip:]


# -- through the CLI ------------------------------------------------------------------------------------


def config(folder: Path, **data: object) -> str:
    """A run's YAML: spiral.yaml's model, the streaming DataModule on ``folder``."""
    spiral = yaml.safe_load((CONFIGS / "spiral.yaml").read_text())
    settings = {
        "path": str(folder),
        "target_column": "label",
        "task": "classification",
        "batch_size": 32,
        **data,
    }
    return yaml.safe_dump({"model": spiral["model"], "data": {"class_path": CLASS, "init_args": settings}})


EPOCHS = 3


def build(folder: Path, *extra: str) -> CLI:
    words = [
        "--config", config(folder, shuffle_row_groups=2), f"--trainer.max_epochs={EPOCHS}",
        "--model.init_args.net.init_args.dropout=0.2", "--trainer.limit_val_batches=2", *extra, *QUIET,
    ]  # fmt: skip
    return main(words, run=False)


def test_resumed_in_the_middle_of_an_epoch_equals_uninterrupted(workdir: Path) -> None:
    folder = write_folder(workdir / "rows", frame_of())
    uninterrupted = build(folder)
    uninterrupted.trainer.fit(uninterrupted.model, datamodule=uninterrupted.datamodule)
    batches = uninterrupted.trainer.num_training_batches
    assert batches > 8
    assert uninterrupted.trainer.global_step == EPOCHS * batches

    first = build(folder)
    step = batches + 5  # after the fifth batch of epoch 1
    first.trainer.callbacks.extend(
        [StopAt(step), ModelCheckpoint(dirpath=workdir / "mid", filename="mid", every_n_train_steps=step)]
    )
    first.trainer.fit(first.model, datamodule=first.datamodule)
    middle = workdir / "mid" / "mid.ckpt"
    checkpoint = torch.load(middle, weights_only=True)
    assert isinstance(first.trainer.train_dataloader, StreamLoader)
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["done"] == 5
    # the fitted preprocessing rides in the checkpoint, as the in-memory path's does
    assert preprocessing_of(checkpoint, str(middle)) == first.datamodule.preprocessor

    resumed = build(folder)
    resumed.trainer.callbacks.append(
        ModelCheckpoint(dirpath=workdir / "again", filename="again", every_n_train_steps=step)
    )
    resumed.trainer.fit(resumed.model, datamodule=resumed.datamodule, ckpt_path=str(middle))
    assert resumed.trainer.global_step == uninterrupted.trainer.global_step
    torch.testing.assert_close(resumed.model.state_dict(), uninterrupted.model.state_dict(), rtol=0, atol=0)
    for key in ("train/loss", "val/loss"):
        torch.testing.assert_close(
            resumed.trainer.callback_metrics[key], uninterrupted.trainer.callback_metrics[key], rtol=0, atol=0
        )


@pytest.mark.slow
def test_stopped_twice_in_one_epoch_and_resumed_equals_uninterrupted(workdir: Path) -> None:
    """The second stop counts the batches of the whole epoch, those the resumed run skipped included."""
    folder = write_folder(workdir / "rows", frame_of())
    uninterrupted = build(folder)
    uninterrupted.trainer.fit(uninterrupted.model, datamodule=uninterrupted.datamodule)
    batches = uninterrupted.trainer.num_training_batches
    checkpoint: str | None = None
    for stop in (batches + 3, batches + 6, None):  # twice in epoch 1, then to the end
        run = build(folder)
        # each run has the callbacks of the run that wrote its checkpoint (Lightning restores their state)
        saver = ModelCheckpoint(dirpath=workdir / str(stop), filename="mid", every_n_train_steps=1)
        run.trainer.callbacks.extend([saver, *([StopAt(stop)] if stop else [])])
        run.trainer.fit(run.model, datamodule=run.datamodule, ckpt_path=checkpoint)
        if stop is not None:
            checkpoint = str(workdir / str(stop) / "mid.ckpt")
            saved = torch.load(checkpoint, weights_only=True)
            assert (saved["global_step"], saved["epoch"]) == (stop, 1)
            assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["done"] == stop - batches
    assert run.trainer.global_step == uninterrupted.trainer.global_step
    torch.testing.assert_close(run.model.state_dict(), uninterrupted.model.state_dict(), rtol=0, atol=0)


@pytest.mark.slow
def test_killed_with_sigkill_mid_epoch_then_resumed_equals_uninterrupted(workdir: Path) -> None:
    """``kill -9`` of a streaming run that saves every step, then ``--ckpt_path last.ckpt``: the same
    weights as a run never stopped, bit for bit."""
    folder = write_folder(workdir / "rows", frame_of())
    uninterrupted = build(folder, "--trainer.logger=false")
    uninterrupted.trainer.fit(uninterrupted.model, datamodule=uninterrupted.datamodule)
    total = uninterrupted.trainer.global_step
    saves = workdir / "saves"
    words = [
        sys.executable, "-m", "src.cli", "fit", "--config", config(folder, shuffle_row_groups=2),
        f"--trainer.max_epochs={EPOCHS}", "--model.init_args.net.init_args.dropout=0.2",
        "--trainer.limit_val_batches=2", "--trainer.logger=false", *QUIET,
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        f"--trainer.callbacks.dirpath={saves}", "--trainer.callbacks.filename=last",
        "--trainer.callbacks.every_n_train_steps=1", "--trainer.callbacks.enable_version_counter=false",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    last = saves / "last.ckpt"
    process = subprocess.Popen(words, cwd=workdir, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (last.exists() and load_checkpoint(last)["global_step"] >= 5) and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    killed_at = load_checkpoint(last)["global_step"]
    assert 5 <= killed_at < total  # killed in the middle of the run, a checkpoint whole
    resumed = subprocess.run([*words, "--ckpt_path", str(last)], cwd=workdir, env=env, capture_output=True)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    final = load_checkpoint(last)
    assert final["global_step"] == total
    torch.testing.assert_close(final["state_dict"], uninterrupted.model.state_dict(), rtol=0, atol=0)


class RowIds(Callback):
    """Each process saves the ``row_id`` of every training row it steps on, per epoch.

    Args:
        folder: Where ``rank<N>.pt`` goes.
    """

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.seen: dict[int, list[int]] = {}

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: tuple, batch_idx: int
    ) -> None:
        self.seen.setdefault(trainer.current_epoch, []).extend(batch[0][:, 0].long().tolist())

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.save(
            {"seen": self.seen, "world_size": trainer.world_size},
            self.folder / f"rank{trainer.global_rank}.pt",
        )


def assert_each_training_row_once(folder: Path, report: Path, world: int, epochs: int) -> None:
    data = StreamingTableDataModule(str(folder), "label", "classification")
    train = train_positions(data).tolist()
    ranks = [torch.load(report / f"rank{r}.pt", weights_only=True) for r in range(world)]
    assert all(r["world_size"] == world for r in ranks)
    for epoch in range(epochs):
        shares = [r["seen"][epoch] for r in ranks]
        assert all(shares)  # every process trained
        assert sorted(i for share in shares for i in share) == train, f"epoch {epoch}"


TINY_RUN = [
    *BARE,
    "--trainer.logger=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.num_sanity_val_steps=0",
]


def test_ddp_two_processes_see_every_training_row_once_per_epoch(workdir: Path) -> None:
    folder = write_folder(workdir / "rows", frame_of())
    run = main(
        [
            "--config", config(folder, encoding={"standardize": False}),
            "--config", str(CONFIGS / "trainer" / "ddp.yaml"),
            "--trainer.strategy=ddp_fork", "--trainer.max_epochs=2", *TINY_RUN, *QUIET,
        ],
        run=False,
    )  # fmt: skip
    run.trainer.callbacks.append(RowIds(str(workdir)))
    run.trainer.fit(run.model, datamodule=run.datamodule)
    assert_each_training_row_once(folder, workdir, world=2, epochs=2)


@pytest.mark.slow
def test_two_nodes_of_two_processes_with_torchrun_see_every_training_row_once(tmp_path: Path) -> None:
    """``torchrun --nnodes=2 --nproc_per_node=2`` twice on this machine, as two machines would run it."""
    folder = write_folder(tmp_path / "rows", frame_of(1200))
    (tmp_path / "run.yaml").write_text(config(folder, encoding={"standardize": False}))
    port, env = free_port(), launch_env()
    launches, logs = [], []
    for node in (0, 1):
        command = [
            str(Path(sys.executable).parent / "torchrun"),
            "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=2",
            "--master_addr=127.0.0.1", f"--master_port={port}",
            "-m", "src.cli", "fit", "--config", str(tmp_path / "run.yaml"),
            "--config", str(CONFIGS / "trainer" / "ddp.yaml"), "--trainer.devices=2", "--trainer.num_nodes=2",
            "--trainer.max_epochs=2", *TINY_RUN, *QUIET,
            "--trainer.callbacks+=src.extras.streaming.test_streaming.RowIds",
            f"--trainer.callbacks.folder={tmp_path}",
        ]  # fmt: skip
        logs.append((tmp_path / f"node{node}.txt").open("w"))
        launches.append(
            subprocess.Popen(command, cwd=tmp_path, env=env, stdout=logs[-1], stderr=subprocess.STDOUT)
        )
    try:
        codes = wait_all(launches, timeout=300)
    finally:
        for log in logs:
            log.close()
    assert codes == [0, 0], "\n\n".join((tmp_path / f"node{n}.txt").read_text() for n in (0, 1))
    assert_each_training_row_once(folder, tmp_path, world=4, epochs=2)


# -- bad input ------------------------------------------------------------------------------------------


def test_a_missing_or_corrupt_file_is_one_sentence_naming_it(cli, workdir: Path, capsys) -> None:
    folder = write_folder(workdir / "rows", frame_of())
    for words in (["--data.init_args.path=nowhere"], []):
        if not words:
            (folder / "part-1.parquet").write_bytes(b"not parquet at all")
        with pytest.raises(SystemExit) as exit_:
            cli("fit", "--config", config(folder), *words, "--trainer.max_epochs=1")
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert ("'nowhere' does not exist" if words else "part-1.parquet' could not be read") in err


def damage(file: Path, column: str, group: int, how: str, checksums: bool) -> None:
    """``file`` written again in row groups of 100 rows (with page checksums if asked), then one of its
    column chunks damaged with its footer intact: ``random`` writes 400 random bytes over the chunk's
    middle, ``swap`` swaps two of its 8-byte values (each still inside the range the footer records)."""
    pd.read_parquet(file).to_parquet(file, row_group_size=100, write_page_checksum=checksums)
    chunk = pq.ParquetFile(file).metadata.row_group(group).column(frame_of().columns.get_loc(column))
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    middle = start + chunk.total_compressed_size // 2
    raw = bytearray(file.read_bytes())
    if how == "random":
        raw[middle - 200 : middle + 200] = np.random.default_rng(0).bytes(400)
    else:
        raw[middle - 8 : middle + 8] = raw[middle : middle + 8] + raw[middle - 8 : middle]
    file.write_bytes(bytes(raw))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "checksums", "caught_by"),
    [
        ("random", False, "is damaged: column 'a' holds values from"),
        ("random", True, "CRC checksum verification failed"),
        ("swap", True, "CRC checksum verification failed"),
    ],
    ids=["random-bytes-no-checksums", "random-bytes-page-checksums", "swapped-values-page-checksums"],
)
def test_a_damaged_page_is_one_sentence_naming_the_file_and_row_group(
    cli, workdir: Path, capsys, how: str, checksums: bool, caught_by: str
) -> None:
    """The page still decodes: without checksums, its values leave the range the footer records; with them
    (Spark's default; pyarrow's ``write_page_checksum=True``), any change to it is caught."""
    folder = write_folder(workdir / "rows", frame_of())
    damage(folder / "part-1.parquet", "a", group=1, how=how, checksums=checksums)
    with pytest.raises(SystemExit) as exit_:
        cli("fit", "--config", config(folder), "--trainer.max_epochs=1")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "part-1.parquet', row group 1, " in err
    assert caught_by in err


def test_a_page_damaged_after_the_fit_is_one_sentence_when_the_stream_reads_it(tmp_path: Path) -> None:
    """A resumed run takes the checkpoint's preprocessing and reads the files only as its epochs stream
    them, on the reading thread: the sentence still reaches the loop."""
    folder = write_folder(tmp_path / "rows", frame_of())
    fitted = StreamingTableDataModule(str(folder), "label", "classification", batch_size=16)
    fitted.preprocessor  # noqa: B018
    damage(folder / "part-1.parquet", "a", group=1, how="random", checksums=False)
    resumed = StreamingTableDataModule(str(folder), "label", "classification", batch_size=16)
    resumed.load_state_dict(fitted.state_dict())
    with pytest.raises(UserInputError, match=r"part-1.parquet', row group 1, is damaged: column 'a'"):
        list(resumed.dataset("val"))


def rewrite(file: Path, **columns: object) -> None:
    """``file`` written again with ``columns`` replaced (pandas picks each one's Parquet type)."""
    pd.read_parquet(file).assign(**columns).to_parquet(file, row_group_size=60)


@pytest.mark.parametrize(
    ("column", "value", "stored"),
    [
        ("a", "3.5", "as double and as large_string"),
        ("b", pd.Timestamp("2024-01-01"), "as float and as timestamp"),
        ("b", [[1.0, 2.0]] * 200, "as float and as list<element: double>"),
        ("label", 1, "as large_string and as int64"),
    ],
    ids=["text-among-numbers", "dates-among-numbers", "lists-among-numbers", "numbers-among-labels"],
)
def test_files_that_store_a_column_as_types_that_do_not_mix_are_one_sentence_naming_both(
    tmp_path: Path, column: str, value: object, stored: str
) -> None:
    folder = write_folder(tmp_path / "rows", frame_of())
    rewrite(folder / "part-1.parquet", **{column: value})
    where = re.escape(str(folder))
    data = StreamingTableDataModule(str(folder), "label", "classification")
    with pytest.raises(
        UserInputError,
        match=rf"^Parquet files '{where}/part-0.parquet' and '{where}/part-1.parquet' store column "
        rf"'{column}' {re.escape(stored)}.*; write the column with one type in every file\.$",
    ):
        data.in_features  # noqa: B018


def test_a_file_without_a_column_is_one_sentence_naming_it_and_one_that_has_it(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "rows", frame_of())
    pd.read_parquet(folder / "part-2.parquet").drop(columns="b").to_parquet(folder / "part-2.parquet")
    where = re.escape(str(folder))
    with pytest.raises(
        UserInputError,
        match=rf"^Parquet file '{where}/part-2.parquet' has no column 'b', which '{where}/part-0.parquet' "
        "has; give every file the same columns.$",
    ):
        StreamingTableDataModule(str(folder), "label", "classification").in_features  # noqa: B018


def test_text_among_numbers_is_one_sentence_through_the_cli(cli, workdir: Path, capsys) -> None:
    folder = write_folder(workdir / "rows", frame_of())
    rewrite(folder / "part-2.parquet", a="3.5")
    with pytest.raises(SystemExit) as exit_:
        cli("fit", "--config", config(folder), "--trainer.max_epochs=1")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        f"error: Parquet files '{folder}/part-0.parquet' and '{folder}/part-2.parquet' store column 'a'"
        in err
    )


@pytest.mark.parametrize(
    ("files", "columns", "sentence"),
    [
        (
            [0, 1, 2],
            {"seen": pd.Timestamp("2024-01-01")},
            r"^Parquet file '{folder}/part-0.parquet', column 'seen', holds dates or durations \(timestamp.*"
            r"\), not numbers or text; turn them into numbers .*or drop the column with data.columns.drop\.$",
        ),
        (
            [0, 1, 2],
            {"tags": [[1, 2]] * 200},
            r"^Parquet file '{folder}/part-0.parquet', column 'tags', holds nested values \(list<element: "
            r"int64>: lists or records\), not numbers or text; .*drop the column with data.columns.drop\.$",
        ),
        (
            [0, 1, 2],
            {"point": [{"x": 1.0, "y": 2.0}] * 200},
            r"^Parquet file '{folder}/part-0.parquet', column 'point', holds nested values \(struct<x: "
            r"double, y: double>: lists or records\).*",
        ),
        (
            [0, 1, 2],
            {"label": pd.Timestamp("2024-01-01")},
            r"^Parquet file '{folder}/part-0.parquet', column 'label', holds dates or durations .*; the "
            r"target must be classes \(text or integers\) or numbers: convert it, or set data.target_column "
            r"to another column\.$",
        ),
        (
            [1],
            {"label": None},
            r"^Parquet file '{folder}/part-1.parquet' has no value in its column 'label' \(all 200 rows "
            r"empty\); fill in the targets, or move the file out of data.path .*data.predict_path\)\.$",
        ),
        (
            [0, 1, 2],
            {"label": None},
            r"^Parquet file '{folder}/part-0.parquet' has no value in its column 'label' \(all 200 rows "
            r"empty\)",
        ),
    ],
    ids=["dates", "lists", "records", "dates-as-target", "a-file-without-labels", "no-file-with-labels"],
)
def test_a_column_the_run_cannot_read_is_one_sentence_naming_the_file_and_column(
    tmp_path: Path, files: list[int], columns: dict[str, object], sentence: str
) -> None:
    folder = write_folder(tmp_path / "rows", frame_of())
    for i in files:
        rewrite(folder / f"part-{i}.parquet", **columns)
    with pytest.raises(UserInputError, match=sentence.format(folder=re.escape(str(folder)))):
        StreamingTableDataModule(str(folder), "label", "classification").in_features  # noqa: B018


def test_types_that_mix_are_read_as_one_type_in_every_file(tmp_path: Path) -> None:
    """Whole numbers stored as integers in one file, text as a dictionary (a pandas category) in another, a
    column without any value (Arrow's null type) in a third: the same fit and the same tensors as when
    every file stores each column with one type."""
    frame = frame_of().assign(b=lambda f: f["b"].round())
    frame.loc[400:, "sparse"] = np.nan  # part-2's rows
    same = StreamingTableDataModule(
        str(write_folder(tmp_path / "same", frame)), "label", "classification", encoding=UNSCALED
    )
    folder = write_folder(tmp_path / "mixed", frame)
    rewrite(folder / "part-0.parquet", b=lambda f: f["b"].astype("int64"))
    rewrite(folder / "part-1.parquet", colour=lambda f: f["colour"].astype("category"))
    rewrite(folder / "part-2.parquet", sparse=None)
    stored = [pq.read_schema(folder / f"part-{i}.parquet").field(name).type for i, name in
              enumerate(["b", "colour", "sparse"])]  # fmt: skip
    assert [pa.types.is_int64(stored[0]), pa.types.is_dictionary(stored[1]), pa.types.is_null(stored[2])] == [
        True,
        True,
        True,
    ]
    mixed = StreamingTableDataModule(str(folder), "label", "classification", encoding=UNSCALED)
    assert mixed.preprocessor == same.preprocessor
    everything = list(range(len(same.groups)))
    for stage in SPLITS:
        torch.testing.assert_close(
            mixed.encode_window(everything, stage), same.encode_window(everything, stage), rtol=0, atol=0
        )


def test_a_target_of_nan_is_a_missing_target(tmp_path: Path) -> None:
    """NaN is no value: its rows are left out, as empty cells are, though the footer counts no empty cell."""
    frame = frame_of()
    target = frame["a"].to_numpy().copy()
    target[::7] = np.nan
    table = pa.Table.from_pandas(frame.drop(columns="a"), preserve_index=False)
    table = table.append_column("a", pa.array(target, from_pandas=False))  # NaN kept as NaN, not as null
    (tmp_path / "rows").mkdir()
    pq.write_table(table, tmp_path / "rows" / "part-0.parquet", row_group_size=100)
    footer = pq.ParquetFile(tmp_path / "rows" / "part-0.parquet").metadata
    assert footer.row_group(0).column(6).statistics.null_count == 0
    data = StreamingTableDataModule(
        str(tmp_path / "rows"), "a", "regression", columns=Columns(drop=["label"])
    )
    assert data.counts.sum() == len(frame) - np.isnan(target).sum()
    _, y = data.encode_window(list(range(len(data.groups))), "train")
    assert torch.isfinite(y).all()
