"""``python -m src.cli predict`` on a table's checkpoint, without the CLI's machinery: the Trainer's file
exactly, through the model's own ``predict_step``."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from src import fast_predict
from src.cli import main
from src.errors import UserInputError
from tests.conftest import PLANTED, QUIET, ROOT

CKPT = "--ckpt_path"


def trainer_predict(ckpt: Path, rows: Path, output: Path) -> bytes:
    """The file the full CLI writes: predict under the Trainer, in-process."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["src.cli"])
        main(["predict", CKPT, str(ckpt), f"--data.predict_path={rows}", f"--output={output}", *QUIET])
    return output.read_bytes()


def fast(*words: str) -> bool:
    return fast_predict.predict(["predict", *words])


@pytest.fixture
def messy(messy_trained, tmp_path: Path) -> tuple[Path, Path]:
    """The shared messy classification run's checkpoint, copied, and its raw validation rows as a CSV:
    named classes, text columns, empty cells, a "?" in a numeric column."""
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    shutil.copy(messy_trained.checkpoint, ckpt)
    rows = tmp_path / "rows.csv"
    messy_trained.raw_rows("val").to_csv(rows, index=False)
    return ckpt, rows


def test_classification_file_is_the_trainers_byte_for_byte(messy, tmp_path: Path, capsys) -> None:
    ckpt, rows = messy
    expected = trainer_predict(ckpt, rows, tmp_path / "trainer.csv")
    assert fast(CKPT, str(ckpt), "--data.predict_path", str(rows), "--output", str(tmp_path / "fast.csv"))
    assert (tmp_path / "fast.csv").read_bytes() == expected
    frame = pd.read_csv(tmp_path / "fast.csv")
    assert set(frame["prediction"]) <= {"high", "low", "mid"}  # labels, not class ids
    assert f"Predictions for {len(frame)} rows written to {tmp_path / 'fast.csv'}" in capsys.readouterr().out


def test_regression_file_is_the_trainers_byte_for_byte(regression_checkpoint, tmp_path: Path) -> None:
    ckpt, raw = regression_checkpoint
    rows = tmp_path / "rows.csv"
    raw.to_csv(rows, index=False)
    expected = trainer_predict(ckpt, rows, tmp_path / "trainer.csv")
    assert fast(CKPT, str(ckpt), f"--data.predict_path={rows}", f"--output={tmp_path / 'fast.csv'}")
    assert (tmp_path / "fast.csv").read_bytes() == expected
    # in the target's units, not the standardized ones the net was trained on
    assert abs(pd.read_csv(tmp_path / "fast.csv")["prediction"].mean()) > 3


def test_default_output_is_beside_the_run_and_no_run_folder_is_made(messy) -> None:
    ckpt, rows = messy
    run = ckpt.parent.parent
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert fast(CKPT, str(ckpt), f"--data.predict_path={rows}")
    after = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert after == sorted([*before, Path("predictions.csv")])
    # a second time the file exists: refused as the prediction writer refuses it, then replaced on request
    with pytest.raises(UserInputError, match=r"predict's default output=.* exists; pass --overwrite"):
        fast(CKPT, str(ckpt), f"--data.predict_path={rows}")
    assert fast(CKPT, str(ckpt), f"--data.predict_path={rows}", "--overwrite=true")


@pytest.mark.parametrize(
    "extra",
    [
        ["--trainer.enable_progress_bar=false"],
        ["--config", "configs/penguins.yaml"],
        ["--data.batch_size=8"],
        ["--overwrite=maybe"],
        ["--output"],
    ],
)
def test_other_words_go_to_the_full_cli(messy, extra: list[str], tmp_path: Path) -> None:
    ckpt, rows = messy
    out = tmp_path / "out.csv"
    words = ["predict", CKPT, str(ckpt), f"--data.predict_path={rows}", *extra]
    assert fast_predict.options(words) is None
    assert not fast_predict.predict(words if "--output" in extra else [*words, f"--output={out}"])
    assert not out.exists()


def test_checkpoints_of_other_data_go_to_the_full_cli(messy_trained) -> None:
    checkpoint = torch.load(messy_trained.checkpoint, weights_only=True)
    assert fast_predict.on_a_table(checkpoint)
    # a model of yours on a table takes this path too: it predicts through its own predict_step
    yours = {**checkpoint, "hyper_parameters": {**checkpoint["hyper_parameters"], "_class_path": "my.Task"}}
    assert fast_predict.on_a_table(yours)
    images = {**checkpoint, "config": {**checkpoint["config"], "data": {"class_path": "src.extras.images.X"}}}
    for other in (images, {k: v for k, v in checkpoint.items() if k != "TabularDataModule"}):
        assert not fast_predict.on_a_table(other)


def test_bad_input_gets_the_full_clis_sentence(messy, tmp_path: Path) -> None:
    ckpt, rows = messy
    missing = tmp_path / "nope.csv"
    with pytest.raises(UserInputError, match=r"data.predict_path='.*nope.csv' does not exist"):
        fast(CKPT, str(ckpt), f"--data.predict_path={missing}", f"--output={tmp_path / 'o.csv'}")
    with pytest.raises(UserInputError, match="an input of this run"):
        fast(CKPT, str(ckpt), f"--data.predict_path={rows}", f"--output={ckpt}")
    text = tmp_path / "broken.ckpt"
    text.write_text("not a checkpoint")
    with pytest.raises(UserInputError, match=r"broken\.ckpt"):
        fast(CKPT, str(text), f"--data.predict_path={rows}", f"--output={tmp_path / 'o.csv'}")
    assert not (tmp_path / "o.csv").exists()


@pytest.mark.parametrize(
    "entry",
    [
        "runpy.run_module('src.cli', run_name='__main__', alter_sys=True)",  # python -m src.cli
        "from src import console; sys.exit(console())",  # lightning-template: pip's script, word for word
    ],
)
def test_the_command_predicts_without_the_trainer(messy, tmp_path: Path, entry: str) -> None:
    """``predict`` as a user types it: the Trainer's file, and none of the Trainer's callbacks loaded."""
    ckpt, rows = messy
    probe = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('callbacks loaded:', 'src.callbacks' in sys.modules))\n"
        f"{entry}\n"
    )
    out = tmp_path / "cmd.csv"
    words = ["predict", CKPT, str(ckpt), "--data.predict_path", str(rows), "--output", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe, *words], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "callbacks loaded: False" in done.stdout
    assert out.read_bytes() == trainer_predict(ckpt, rows, tmp_path / "trainer.csv")
    bad = subprocess.run(
        [sys.executable, "-c", probe, *words[:-1], str(ckpt)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("error: --output=")
    assert "an input of this run" in bad.stderr


@pytest.mark.parametrize("where", ["net", "optimizer"])
def test_a_checkpoint_naming_code_of_elsewhere_is_refused_before_anything_is_imported(
    messy_trained, planted: Path, workdir: Path, where: str
) -> None:
    """The net this path imports, or any name it never uses: refused unread, as the full CLI refuses it."""
    checkpoint = torch.load(messy_trained.checkpoint, weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    if where == "net":
        hparams["net"] = {"class_path": f"{PLANTED}.Optimizer", "init_args": {}}
    else:
        checkpoint["config"]["model"]["init_args"]["optimizer"] = {"class_path": f"{PLANTED}.Optimizer"}
    torch.save(checkpoint, workdir / "theirs.ckpt")
    rows = workdir / "rows.csv"
    messy_trained.raw_rows("val").to_csv(rows, index=False)
    with pytest.raises(UserInputError, match=f"names '{PLANTED}.Optimizer'.*code outside this project"):
        fast(CKPT, str(workdir / "theirs.ckpt"), f"--data.predict_path={rows}", "--output=out.csv")
    assert not planted.exists()
    assert not (workdir / "out.csv").exists()
