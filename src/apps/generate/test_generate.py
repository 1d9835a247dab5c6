"""``python -m src.apps.generate`` from a checkpoint alone: repeatable, streamed, one sentence for bad
input; and the speed benchmark's machinery."""

import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from src.apps import generate as generate_app
from src.apps.generate import bench as charlm_speed
from src.apps.generate import main as generate_main
from src.cli import CLI
from src.extras.text import conftest as text
from src.extras.text.conftest import T, last_checkpoint

#: the text extra's small text and the tiny model fitted on it (the app goes with the extra)
small_text, trained_charlm = text.small_text, text.trained_charlm


def generated(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    generate_main(list(words))
    return capsys.readouterr().out


@pytest.mark.slow
def test_generate_from_the_checkpoint_alone_repeats_itself(
    trained_charlm: CLI, capsys, workdir: Path
) -> None:
    ckpt = str(last_checkpoint(trained_charlm))
    greedy = ["--ckpt_path", ckpt, "--prompt", "def ", "--strategy", "greedy", "--max_new_tokens", "40"]
    first = generated(capsys, *greedy)
    assert first.startswith("def ")
    assert len(first) == len("def ") + 40 + 1  # and print's line break
    assert generated(capsys, *greedy) == first
    sample = [
        "--ckpt_path",
        ckpt,
        "--prompt",
        "def ",
        "--top_k",
        "10",
        "--top_p",
        "0.95",
        "--max_new_tokens",
        "60",
    ]
    seeded = generated(capsys, *sample, "--seed", "3")
    assert generated(capsys, *sample, "--seed", "3") == seeded
    assert generated(capsys, *sample, "--seed", "4") != seeded
    # into a file, never over one without --overwrite
    out = workdir / "sample.txt"
    generate_main([*greedy, "--output", str(out)])
    assert out.read_text(encoding="utf-8") == first.removesuffix("\n")
    with pytest.raises(SystemExit) as exit_:
        generate_main([*greedy, "--output", str(out)])
    assert exit_.value.code == 2
    assert "exists; pass --overwrite true" in capsys.readouterr().err
    generate_main([*greedy, "--output", str(out), "--overwrite", "true", "--max_new_tokens", "5"])
    assert out.read_text(encoding="utf-8") == first[: len("def ") + 5]


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["--ckpt_path", "missing.ckpt"], "checkpoint 'missing.ckpt' does not exist"),
        (["--ckpt_path", "classifier.ckpt"], "is not a language model (it holds src.models.Classifier)"),
        (["--top_p", "1.5"], "--top_p=1.5 must lie in (0, 1]"),
        (["--temperature", "-1"], "--temperature=-1.0 must be at least 0"),
        (["--prompt", ""], "--prompt is empty"),
        (["--prompt_file", "missing.txt"], "--prompt_file='missing.txt' does not exist"),
        (["--strategy", "beam"], "strategy: 'beam' is not accepted"),
        (["--seed", str(2**70)], "--seed=1180591620717411303424 must lie between 0 and 2**64 - 1"),
        (
            ["--max_new_tokens", "1000000000"],
            "--max_new_tokens=1000000000 is more than the 100000 allowed; ask for fewer, or raise the limit "
            "(--token_limit).",
        ),
        (
            ["--max_new_tokens", "11", "--token_limit", "10"],
            "--max_new_tokens=11 is more than the 10 allowed",
        ),
        (["--top_k", "500"], "--top_k=500 is more than the "),
        (["--threads", "0"], "--threads=0 must be at least 1, or null for torch's default."),
        (["--accelerator", "tpu"], "accelerator: 'tpu' is not accepted"),
        (["--prompt_file", "fifo"], "--prompt_file='fifo' is a named pipe (FIFO), not a file"),
    ],
)
def test_bad_generate_input_is_one_sentence_and_exit_2(
    trained_charlm: CLI, workdir: Path, capsys, words: list[str], message: str
) -> None:
    torch.save(
        {"state_dict": {}, "config": {"model": {"class_path": "src.models.Classifier"}}}, "classifier.ckpt"
    )
    os.mkfifo("fifo")  # read, it would wait for a writer for ever
    with pytest.raises(SystemExit) as exit_:
        generate_main(["--ckpt_path", str(last_checkpoint(trained_charlm)), *words])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1  # one line, no traceback


def test_generate_streams_each_character_on_one_thread_and_a_tiny_temperature_is_greedy(
    trained_charlm: CLI, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = str(last_checkpoint(trained_charlm))
    greedy = ["--ckpt_path", ckpt, "--prompt", "def ", "--strategy", "greedy", "--max_new_tokens", "12"]
    expected = generated(capsys, *greedy)
    # sampling at a temperature that float32 cannot divide by: the likeliest character, every time
    assert generated(capsys, *greedy[:-4], "--temperature", "1e-40", "--max_new_tokens", "12") == expected
    # each character is written as soon as it is chosen, with torch on the one thread of every command
    forwards: list[int] = []
    real_load = generate_app.load

    def counted(*args: Any) -> Any:
        loaded = real_load(*args)
        loaded[0].register_forward_hook(lambda *_: forwards.append(torch.get_num_threads()))
        return loaded

    writes: list[tuple[str, int]] = []

    class Recorder:
        def write(self, text: str) -> None:
            writes.append((text, len(forwards)))

        def flush(self) -> None:
            pass

    before = torch.get_num_threads()
    torch.set_num_threads(2)  # what torch takes on two cores, unless told
    try:
        with monkeypatch.context() as patch:
            patch.setattr(generate_app, "load", counted)
            patch.setattr(sys, "stdout", Recorder())
            generate_main(greedy)
        assert torch.get_num_threads() == 2  # given back as it was
    finally:
        torch.set_num_threads(before)
    assert set(forwards) == {1}
    assert "".join(text for text, _ in writes) == expected
    assert writes[0] == ("def ", 0)  # the prompt before any forward pass
    assert [count for _, count in writes[1:-1]] == list(range(1, 13))  # the k-th after the k-th pass
    assert writes[-1] == ("\n", 12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
def test_generate_on_a_gpu_writes_what_it_writes_on_the_cpu(trained_charlm: CLI, capsys) -> None:
    words = ["--ckpt_path", str(last_checkpoint(trained_charlm)), "--prompt", "def ", "--strategy", "greedy"]
    on_cpu = generated(capsys, *words, "--accelerator", "cpu")
    assert generated(capsys, *words, "--accelerator", "cuda") == on_cpu
    assert generated(capsys, *words) == on_cpu  # auto: the GPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a CUDA GPU runs what is asked")
def test_generate_asked_for_a_gpu_that_is_not_there_says_so(trained_charlm: CLI, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        generate_main(["--ckpt_path", str(last_checkpoint(trained_charlm)), "--accelerator", "cuda"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "error: --accelerator cuda needs a CUDA GPU, and torch sees none; pass auto or cpu.\n"
    )


def test_the_speed_benchmark_trains_and_generates_what_its_table_says(small_text: Path) -> None:
    setup = charlm_speed.from_config(steps=3, new_tokens=5)
    assert setup.net["block_size"] == setup.block_size  # the config's net reads its whole windows
    small = charlm_speed.Setup(
        net={"block_size": T, "d_model": 16, "n_heads": 2, "n_layers": 1},
        block_size=T,
        batch_size=8,
        steps=3,
        new_tokens=5,
        text_path=str(small_text),
    )
    results = charlm_speed.measure(small, rounds=1, warm_up=False)
    for runs in results.runs.values():
        (run,) = runs
        assert run.train_chars == 3 * 8 * T
        assert run.generated == 5
        assert 0 < run.train_wall < 1e6  # a clock that never stopped would read the time since the epoch
        assert 0 < run.generate_wall < 1e6
        assert 0 < run.loss < math.inf
    rows = [line for line in charlm_speed.table(results).splitlines() if line.startswith("| ")]
    assert rows[0] == "| " + " | ".join(charlm_speed.COLUMNS) + " |"
    assert len(rows) == 1 + len(results.runs)


@pytest.mark.slow  # a fit through the CLI and four generate processes
def test_the_speed_benchmark_times_the_command_beside_the_function(small_text: Path, tmp_path: Path) -> None:
    small = charlm_speed.Setup(
        net={"block_size": T, "d_model": 16, "n_heads": 2, "n_layers": 1},
        block_size=T,
        batch_size=8,
        steps=3,
        text_path=str(small_text),
    )
    found = charlm_speed.measure_generation(small, rounds=1, folder=tmp_path, new_tokens=50)
    assert [(g.path, g.threads.split(" ")[0]) for g in found] == [
        ("python -m src.apps.generate", "default"),
        ("python -m src.apps.generate", "--threads"),
        ("generate()", "1"),
        ("generate()", "torch's"),
    ]
    assert all(len(g.speeds) == 1 and math.isfinite(g.speeds[0]) for g in found)
    assert all(g.speeds[0] > 0 for g in found[2:])  # the function's own clock: no start-up to subtract
    rows = [
        line for line in charlm_speed.generation_table(found, small, 50).splitlines() if line.startswith("| ")
    ]
    assert len(rows) == 1 + len(found)


# -- the shipped config ------------------------------------------------------------------------------------
