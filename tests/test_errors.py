"""Bad input stops early with one sentence that names the file, column, key or value, and exit status 2."""

import time
from pathlib import Path

import pytest
import torch

from src.cli_errors import check_config_files
from src.errors import UserInputError


def fails(cli, capsys, *args: str) -> str:
    """Run the CLI, expect exit status 2, and return the single error line."""
    with pytest.raises(SystemExit) as exit_:
        cli("fit", *args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "usage:" not in err  # the parser's error is one line, not its usage text
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(("val", "test"), [(0.5, 0.5), (0.0, 0.2), (0.1, 1.2), (-0.1, 0.3)])
def test_split_fractions_that_do_not_fit(cli, capsys, val: float, test: float, nothing_written) -> None:
    line = fails(
        cli,
        capsys,
        "--config",
        "digits.yaml",
        f"--data.split.val_fraction={val}",
        f"--data.split.test_fraction={test}",
    )
    assert f"data.split.val_fraction={val} and data.split.test_fraction={test} do not fit" in line


def test_model_and_data_task_mismatch(cli, capsys, nothing_written) -> None:
    line = fails(cli, capsys, "--config", "digits.yaml", "--data.source=diabetes")
    assert "model Classifier needs at least 2 classes but the data gives out_features=1" in line
    line = fails(cli, capsys, "--config", "diabetes.yaml", "--data.source=digits")
    assert "model Regressor predicts one value but the data gives out_features=10" in line


def test_unknown_config_key(cli, capsys, nothing_written) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli("fit", "--config", "digits.yaml", "--data.batch_sise=3")
    assert exit_.value.code == 2
    assert "batch_sise" in capsys.readouterr().err


def test_unknown_key_inside_a_config_file(cli, capsys, workdir: Path) -> None:
    # a typo in one of the net's own arguments, under the task's ``net``
    (workdir / "typo.yaml").write_text(
        "model:\n  init_args:\n    net:\n      init_args:\n        hiden_sizes: [8]\n"
    )
    with pytest.raises(SystemExit) as exit_:
        cli("fit", "--config", "digits.yaml", "--config", "typo.yaml")
    assert exit_.value.code == 2
    assert "hiden_sizes" in capsys.readouterr().err


def test_a_key_indented_under_a_class_it_does_not_belong_to_is_named(cli, capsys, workdir: Path) -> None:
    # the Trainer's callbacks indented one level too deep, under the model
    (workdir / "indent.yaml").write_text("model:\n  init_args: {}\n  callbacks: []\n")
    line = fails(cli, capsys, "--config", "digits.yaml", "--config", "indent.yaml")
    assert line.startswith(
        "error: model.callbacks is not a key of model, which takes class_path, init_args and dict_kwargs; "
        "move it where it belongs (check its indentation)"
    )


def test_unknown_key_in_a_callback_section_of_a_config_file(cli, capsys, workdir: Path) -> None:
    (workdir / "typo.yaml").write_text("early_stopping:\n  init_args:\n    patiense: 5\n")
    line = fails(cli, capsys, "--config", "spiral.yaml", "--config", "typo.yaml")
    assert "early_stopping" in line
    assert "early_stopping.patiense is not an option of" in line


@pytest.mark.parametrize(
    ("typed", "written"),
    [
        (["--optimizer=SGD"], "--model.init_args.optimizer=SGD"),
        (["--optimizer", "SGD"], "--model.init_args.optimizer SGD"),
        (["--optimizer.lr=0.1"], "--model.init_args.optimizer.lr=0.1"),
        (["--lr_scheduler", "StepLR"], "--model.init_args.scheduler StepLR"),
        (["--lr_scheduler.step_size=3"], "--model.init_args.scheduler.step_size=3"),
    ],
)
def test_lightnings_own_optimizer_options_point_to_the_models_arguments(
    cli, capsys, typed: list[str], written: str, nothing_written
) -> None:
    """LightningCLI's top-level --optimizer and --lr_scheduler are off (they would silently replace the
    model's): each form gets the model's argument to write instead, not a bare "unrecognized"."""
    line = fails(cli, capsys, "--config", "spiral.yaml", *typed)
    where = "optimizer" if "optimizer" in typed[0] else "scheduler"
    assert line.startswith(f"error: {' '.join(typed)} is not an option: the {where} is the model's own")
    assert f"model.init_args.{where}; write {written};" in line


SPIRAL = ["--config", "spiral.yaml", "--data.num_samples=300"]
SCHEDULER = "--model.init_args.scheduler.init_args"
NET = "--model.init_args.net.init_args"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (["--model.init_args.optimizer.init_args.lr=-1"], "optimizer: Invalid learning rate: -1.0"),
        (["--trainer.max_epochs=-5"], "`max_epochs` must be a non-negative integer or -1. You passed in -5."),
        (["--trainer.max_epochs=0"], "trainer.max_epochs=0 (or max_steps=0) trains nothing"),
        (
            [f"{NET}.hidden_sizes=[-1]"],
            "model.init_args.net: MLP hidden_sizes=[-1]: every width must be at least 1.",
        ),
        ([f"{NET}.dropout=1.5"], "model.init_args.net: MLP dropout=1.5 must lie in [0, 1)."),
        (["--data.num_workers=-1"], "data.num_workers=-1 must be 0 (load in this process) or more"),
        (["--trainer.accelerator=gpu"], "No supported gpu backend found!"),
        (["--data.batch_size=abc"], "data.batch_size: 'abc' is not accepted (expected int)"),
        (["--trainer.precision=bf17"], "trainer.precision: 'bf17' is not accepted (expected one of"),
        (["--model.init_args.optimizer=torch.optim.Adamm"], "module 'torch.optim' has no attribute 'Adamm'"),
        (
            ["--data.batch_sise=3"],
            "data.batch_sise is not an option of src.data.ArrayDataModule; --data.help "
            "src.data.ArrayDataModule lists its options.",
        ),
        (
            ["--early_stopping.patiense=5"],
            "early_stopping.patiense is not an option of lightning.pytorch.callbacks.EarlyStopping",
        ),
        (["--early_stoping.patience=5"], "unrecognized arguments: --early_stoping.patience=5"),
        (
            ["--early_stopping=null", "--early_stopping.patience=5"],  # switched off, then half set up
            "early_stopping is off (null), so it has no class to take patience; name its class again",
        ),
        (["--trainer.logger.init_args.save_dir=/proc/runs"], "save_dir='/proc/runs' is not writable"),
        (["--weights_only=false"], "--weights_only=false would let a checkpoint run code as it loads"),
        (
            ["--config", "trainer/warmup_cosine.yaml", f"{SCHEDULER}.warmup_steps=9999"],
            "warmup_steps=9999 must lie in (0, total_steps=",
        ),
    ],
    ids=["negative-lr", "negative-epochs", "zero-epochs", "negative-width", "dropout-above-one",
         "negative-workers", "gpu-on-cpu",
         "batch-size-text", "precision-typo", "optimizer-typo", "unknown-key", "callback-key-typo",
         "callback-section-typo", "callback-without-class", "unwritable-log-folder", "code-in-checkpoints",
         "warmup-longer-than-the-run"],
)  # fmt: skip
def test_mistaken_settings_are_one_sentence(cli, capsys, args, sentence, nothing_written) -> None:
    assert sentence in fails(cli, capsys, *SPIRAL, *args)


def test_a_log_folder_that_is_a_file(cli, capsys, workdir: Path) -> None:
    (workdir / "taken").write_text("not a folder")
    line = fails(cli, capsys, *SPIRAL, "--trainer.logger.init_args.save_dir=taken/runs")
    assert "save_dir='taken/runs' cannot be a folder: 'taken' is a file" in line


def test_a_config_file_that_is_not_yaml_is_named(cli, capsys, workdir: Path) -> None:
    (workdir / "broken.yaml").write_text("model:\n  init_args: [unclosed\n")
    line = fails(cli, capsys, *SPIRAL, "--config", "broken.yaml")
    assert "config file 'broken.yaml' is not valid YAML at line 3" in line
    assert not (workdir / "logs").exists()


def billion_laughs() -> bytes:
    """About 400 bytes of YAML whose nine nested aliases stand for 9**9 strings."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for before, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{before}'] * 9)}]")
    return "\n".join(lines).encode() + b"\n"


#: config files that YAML reads without complaint but that cannot be what the user meant, and the sentence
CONFIG_FILES = {
    "commented-out-section": (
        b"trainer:\n#  max_epochs: 3\n#  precision: bf16-mixed\n",
        "config file 'x.yaml' has an empty trainer section at line 1, which would drop every trainer "
        "setting given before it; remove the `trainer:` line or give it settings.",
    ),
    "section-twice": (
        b"trainer:\n  max_epochs: 1\nmodel:\n  init_args: {}\ntrainer:\n  max_epochs: 2\n",
        "config file 'x.yaml' gives trainer a second time at line 5 (first at line 1), and YAML would keep "
        "only the last; merge them into one.",
    ),
    "key-twice-inside": (
        b"trainer:\n  max_epochs: 1\n  max_epochs: 2\n",
        "config file 'x.yaml' gives max_epochs a second time at line 3 (first at line 2)",
    ),
    "alias-bomb": (
        billion_laughs(),
        "config file 'x.yaml' expands its aliases beyond 10,000 values at line",
    ),
    "alias-inside-itself": (
        b"trainer: &t\n  callbacks: [*t]\n",
        "config file 'x.yaml' has an alias inside the value it names at line 2",
    ),
    "latin-1": (
        b"# caf\xe9 au lait\ntrainer:\n  max_epochs: 1\n",
        "config file 'x.yaml' is not UTF-8 text (byte 0xe9 at line 1, column 6); save it as UTF-8.",
    ),
    "empty": (b"", "config file 'x.yaml' is empty; give it settings or leave it out."),
    "only-comments": (
        b"# trainer:\n#   max_epochs: 3\n",
        "config file 'x.yaml' holds no settings; give it settings or leave it out.",
    ),
    "a-list": (b"- trainer\n- model\n", "config file 'x.yaml' holds a list, not settings"),
}


@pytest.mark.parametrize("kind", list(CONFIG_FILES))
def test_a_config_file_yaml_reads_silently_wrong_is_named(cli, capsys, workdir: Path, kind: str) -> None:
    content, sentence = CONFIG_FILES[kind]
    (workdir / "x.yaml").write_bytes(content)
    started = time.perf_counter()
    with pytest.raises(UserInputError) as refused:
        check_config_files(["fit", "--config", "x.yaml"])
    assert time.perf_counter() - started < 0.5  # an alias bomb is refused, not expanded
    assert str(refused.value).startswith(sentence)
    assert sentence in fails(cli, capsys, *SPIRAL, "--config", "x.yaml")
    assert not (workdir / "logs").exists()


def test_a_folder_given_as_config_is_named(cli, capsys, workdir: Path) -> None:
    (workdir / "configs").mkdir()
    line = fails(cli, capsys, *SPIRAL, "--config", "configs")
    assert line == "error: config file 'configs' is a folder, not a file; give the path of a YAML file."


def test_sections_switched_off_with_null_pass_the_check(workdir: Path) -> None:
    (workdir / "off.yaml").write_text(
        "seed_everything: null\nckpt_path: null\nearly_stopping: null\n"
        "base: &base {max_epochs: 2}\ntrainer:\n  <<: *base\n  max_epochs: 3\n"
    )
    check_config_files(["fit", "--config", "off.yaml"])  # a merge key that is then overridden is no twin


@pytest.mark.parametrize("kind", ["text", "truncated", "pickled-code"])
def test_a_checkpoint_that_is_not_one(cli, capsys, workdir: Path, kind: str) -> None:
    marker = workdir / "code-ran"
    path = workdir / f"{kind}.ckpt"
    if kind == "text":
        path.write_text("model: {}\n")
    else:
        torch.save({"state_dict": {}, "payload": Payload(str(marker))}, path)
        if kind == "truncated":
            path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(SystemExit) as exit_:
        cli("test", *SPIRAL, "--ckpt_path", str(path))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    expected = {
        "text": "is not a checkpoint file",
        "truncated": "is damaged or truncated (its archive cannot be read)",
        "pickled-code": "holds objects other than tensors and plain data, which would run code",
    }[kind]
    assert f"error: checkpoint '{path}' {expected}" in err
    assert not marker.exists()
    assert not (workdir / "logs").exists()


class Payload:
    """Pickles to a call that would leave a marker file: proof that loading ran code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_no_logger_runs_with_the_shipped_callbacks(cli, workdir: Path) -> None:
    run = cli("fit", *SPIRAL, "--trainer.logger=false", "--trainer.max_epochs=1")
    assert run.trainer.state.finished
    assert run.trainer.global_step > 0


def test_a_lost_process_is_one_sentence_with_what_was_saved_and_a_taken_port_names_the_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sentences of src.cli_errors.lost_process, from the errors torch and gloo raise, written out here
    as they word them."""
    import torch.distributed as dist

    from src.cli_errors import lost_process

    gloo = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:64214: Connection "
        "reset by peer. This is typically caused by a remote worker hanging\nException raised from ..."
    )
    gloo.add_note("nothing was saved after step 10; the last checkpoint, last.ckpt, is whole")
    wrapped = ValueError("while fitting")
    wrapped.__cause__ = gloo
    assert lost_process(wrapped) == (
        "this process lost the other processes of the distributed run (Read error [127.0.0.1]:64214: "
        "Connection reset by peer) and stopped; nothing was saved after step 10; the last checkpoint, "
        "last.ckpt, is whole."
    )
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29512")
    taken = dist.DistNetworkError("The server socket has failed to listen on any local network address.")
    assert lost_process(taken) == (
        "this process could not meet the other processes of the distributed run at 127.0.0.1:29512 (The "
        "server socket has failed to listen on any local network address); free that port or choose another "
        "(MASTER_PORT, or torchrun's --master_port) and start again."
    )
    assert lost_process(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None  # a bug
