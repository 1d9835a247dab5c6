"""The README and the docs pages as a newcomer meets them: every command and snippet runs as printed.

Each fenced ``bash`` or ``python`` block of README.md, then of each page of ``docs/`` in the order the
README links them, then of the page of each folder that holds tests of its own beside its code (the
folders pytest collects beyond ``tests/`` and ``examples/``: each plug-in's ``README.md``), runs, top to
bottom, in one scratch folder that stands in for the repository's root (``configs/`` copied, ``src``
importable and linked), so that a later block finds what an earlier one made, as it would for a reader
following along. Training commands run in a short form (two epochs of three batches); ``make X`` runs the
commands ``make -n X`` prints. A command that is not run is named in :data:`NOT_RUN` (what it starts
with) or :data:`NEEDS` (what it contains), with the reason, or by the page that prints it, in a comment
of its own (:func:`skipped_by_pages`); ``test_every_command_is_run_or_skipped_by_name`` counts them, so a
new command that fits none fails the suite until it runs or says why it cannot. The walkthroughs fit (and
more) for minutes in all: they run in ``make test-full`` (``-m slow``); the checks of links and make
targets in ``make test``.
"""

import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from src.cli import main
from tests.conftest import CONFIGS, ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """README.md, the docs pages in the order its links name them, then the page of each folder of tests
    beside its code (each goes with its folder), in the order of pytest's testpaths and of the folders'
    names: a later page may go on from what an earlier one made."""
    linked = re.findall(r"\]\((docs/[\w-]+\.md)\)", README.read_text())
    beside = [ROOT / folder for folder in TESTPATHS if folder not in ("tests", "examples")]
    return [
        README,
        *(ROOT / name for name in dict.fromkeys(linked)),
        *(page for folder in beside for page in sorted(folder.glob("*/README.md"))),
    ]


#: the folders pytest collects (pyproject.toml): the core's tests, the examples', then each plug-in's own
TESTPATHS: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
    "testpaths"
]


VENV_BIN = Path(sys.executable).parent

#: commands not run, by how they start, and why
NOT_RUN = {
    "make test": "the test suite itself",
    "make test-full": "the test suite itself, slow tests included",
    "make lint": "CI runs it",
    "make tensorboard": "a server that runs until stopped",
    "make bench": "minutes of measurement; benchmarks are not tests",
    "source .venv/bin/activate": "this test runs inside the environment already",
    "pre-commit install": "would change the git hooks of the clone",
}
#: commands not run, by what they contain, and why: what CI lacks, or several processes
NEEDS = {
    "trainer/ddp.yaml": "several processes; tests/test_distributed.py runs the ddp fragment",
    "trainer/fsdp.yaml": "several processes; tests/test_distributed.py runs the fsdp fragment",
    "consolidate_checkpoint": "the FSDP run above; tests/test_distributed.py consolidates one",
    "last.full.ckpt": "the FSDP run above; tests/test_distributed.py tests a consolidated one",
    "torchrun": "several processes or machines; tests/test_distributed.py launches torchrun",
    "srun ": "a SLURM cluster",
    "postgresql://": "a database server",
}
#: commands that train many times (trials, folds, seeds) run in short form too: few of each
FEWER = {"--trials": "2", "--folds": "2", "--seeds": "2"}
SHORT = {
    "fit": [
        "--trainer.max_epochs=2",
        "--trainer.limit_train_batches=3",
        "--trainer.limit_val_batches=2",
        "--trainer.limit_test_batches=2",
    ],
    "validate": ["--trainer.limit_val_batches=2"],
    "test": ["--trainer.limit_test_batches=2"],
    "predict": [],
}
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
#: what a command needs beside SHORT to fit in the short form, by what it contains, and why
SHORT_ALSO = {
    "trainer/warmup_cosine.yaml": (
        ["--model.init_args.scheduler.init_args.warmup_steps=2"],
        "its 100 warmup steps are more than the short form's 6 optimizer steps, which the schedule refuses",
    ),
}


@dataclass
class Block:
    page: Path
    language: str
    line: int  # where the block's first line is in its page
    text: str


def blocks() -> list[Block]:
    """Every page's bash and python blocks, and the json blocks it names as files (`` `x.json` `` in the
    lines just before), which are saved under that name when their turn comes."""
    return [block for page in pages() for block in page_blocks(page)]


def page_blocks(page: Path) -> list[Block]:
    found, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = re.fullmatch(r"```(bash|python|json)", lines[i].strip())
        if match:
            end = lines.index("```", i + 1)
            text = "\n".join(lines[i + 1 : end])
            named = re.search(r"`(\w+\.json)`", " ".join(lines[max(0, i - 3) : i]))
            if match.group(1) != "json":
                found.append(Block(page, match.group(1), i + 2, text))
            elif named:
                found.append(Block(page, f"file:{named.group(1)}", i + 2, text))
            i = end
        i += 1
    return found


def commands(script: str) -> list[str]:
    """Shell commands of a bash block: comments dropped, continued lines joined, here-documents kept."""
    out: list[str] = []
    lines = script.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\"):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        heredoc = re.search(r"<<'?(\w+)'?", line)
        if heredoc:
            end = lines.index(heredoc.group(1), i)
            line = "\n".join([line, *lines[i : end + 1]])
            i = end + 1
        out.append(line)
    return out


def skipped_by_pages() -> dict[str, str]:
    """What the pages say they print but the walkthrough cannot run, by what the command contains, and why:
    a comment ``<!-- not run: `<part of the command>` <why> -->`` beside the block, so that the rule goes
    with its page."""
    said = (re.findall(r"<!-- not run: `([^`]+)` ([^>]+?) -->", page.read_text()) for page in pages())
    return {part: " ".join(reason.split()) for found in said for part, reason in found}


def skip_reason(command: str) -> str | None:
    for start, reason in NOT_RUN.items():
        if command.split("#")[0].strip() == start or command.startswith(start + " "):
            return reason
    needs = {**NEEDS, **skipped_by_pages()}
    return next((reason for part, reason in needs.items() if part in command), None)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("readme")
    shutil.copytree(CONFIGS, folder / "configs")
    # the example data a config writes once into the repository's data/, as a reader's run would
    (ROOT / "data").mkdir(exist_ok=True)
    (folder / "data").symlink_to(ROOT / "data")
    (folder / "src").symlink_to(ROOT / "src")  # the files the pages name there (a plug-in's own configs)
    return folder


LEDGER: dict[str, list[str]] = {"run": [], "skipped": [], "inner": []}


def run_command(command: str, scratch: Path, record: bool = True) -> None:
    reason = skip_reason(command)
    if reason is not None:
        LEDGER["skipped" if record else "inner"].append(f"{command.splitlines()[0]}  ({reason})")
        return
    words = shlex.split(command.split(" #")[0]) if "\n" not in command else []
    if words[:1] == ["make"]:
        # what make would run, relative to the repository root, from the scratch root
        printed = subprocess.run(
            ["make", "-s", "-n", "-C", str(ROOT), *words[1:]], capture_output=True, text=True, check=True
        ).stdout
        for line in printed.splitlines():
            if "pip install" in line or line.startswith(("test ", "touch ", "@")):
                continue  # creating .venv: this test runs in it
            run_command(line.replace(".venv/bin/", ""), scratch, record=False)
        LEDGER["run"].append(command)
        return
    if words[:3] == ["python", "-m", "src.cli"]:
        cli = words[3:]
        status: int | str | None = 0
        try:
            with warnings.catch_warnings():
                # the README proves that its commands run; quietness is another test's business
                warnings.simplefilter("ignore")
                also = [word for part, (extra, _) in SHORT_ALSO.items() if part in command for word in extra]
                helps = any(word.endswith(".help") for word in cli)  # prints and exits: nothing to shorten
                main(cli if helps else [*cli, *SHORT.get(cli[0], []), *also, *QUIET])
        except SystemExit as exit:  # --help and --print_config end with 0; bad input with 2 and a sentence
            status = exit.code
        assert status in (0, None), f"documented command failed (exit status {status}): {command}"
        if record:
            LEDGER["run"].append(command)
        return
    if words[:2] == ["python", "-m"] and any(word in FEWER for word in words):
        for i, word in enumerate(words[:-1]):
            if word in FEWER:
                words[i + 1] = FEWER[word]
        command = shlex.join([*words, *SHORT["fit"], *QUIET])
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", "-c", command], cwd=scratch, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"documented command failed: {command}\n{done.stdout}\n{done.stderr}"
    if record:
        LEDGER["run"].append(command)


def as_param(block: Block) -> Any:
    """A block, named by its page (a plug-in's by its folder) and line."""
    page = block.page.stem if block.page.parent in (ROOT, DOCS) else block.page.parent.name
    return pytest.param(block, id=f"{page}-{block.language}-line{block.line}")


#: the pages whose blocks this session ran (or saw skip a command), for the count below
PAGES_RUN: set[Path] = set()


@pytest.mark.slow
@pytest.mark.parametrize("block", [as_param(block) for block in blocks()])
def test_readme_block_runs_as_printed(block: Block, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    PAGES_RUN.add(block.page)
    monkeypatch.chdir(scratch)
    monkeypatch.setattr(sys, "argv", ["src.cli"])
    monkeypatch.syspath_prepend(str(scratch))
    if block.language == "bash":
        for command in commands(block.text):
            run_command(command, scratch)
        return
    if block.language.startswith("file:"):
        (scratch / block.language.removeprefix("file:")).write_text(block.text)
        importlib.invalidate_caches()  # as a new process would: the folder's listing may be cached
        return
    saved_as = re.match(r"# (\w+\.py)", block.text)
    if saved_as:  # a file the README asks to save: saved, then imported as the commands after it will
        (scratch / saved_as.group(1)).write_text(block.text)
        # the in-process CLI imports it as a new process would: an import's cached listing of the folder,
        # taken within the same clock tick as the write, would not show the file
        importlib.invalidate_caches()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(block.text, f"{block.page.name}:{block.line}", "exec"), {"__name__": "__readme__"})
    LEDGER["run"].append(f"python block at {block.page.name}:{block.line}")


@pytest.mark.slow
def test_every_command_is_run_or_skipped_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    ran = [b for b in blocks() if b.page in PAGES_RUN]
    assert README in PAGES_RUN
    every = [c for b in ran if b.language == "bash" for c in commands(b.text)]
    python_blocks = [b for b in ran if b.language == "python"]
    with capsys.disabled():
        run, skipped, total = len(LEDGER["run"]), len(LEDGER["skipped"]), len(every) + len(python_blocks)
        print(f"\nREADME and docs: {run} commands and snippets run, {skipped} skipped by name, of {total}")
    assert len(LEDGER["run"]) + len(LEDGER["skipped"]) == len(every) + len(python_blocks)
    assert len(LEDGER["run"]) > len(LEDGER["skipped"])


def test_every_docs_page_is_linked_from_the_readme_and_the_readme_is_a_first_hours_read() -> None:
    linked = [page for page in pages() if page.parent == DOCS]
    assert sorted(linked) == sorted(DOCS.glob("*.md"))  # none orphaned, so none left untested
    assert len(README.read_text().splitlines()) <= 350


def test_every_link_to_a_file_of_the_repository_resolves() -> None:
    """README.md's links, and each page's, to files and folders of the repository (a plug-in's page among
    them) name what is there."""
    for page in pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:", "#")) or "benchmarks/results/" in target:
                continue  # the web, and the tables `make bench` writes
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.exists(), f"{page.relative_to(ROOT)} links to {target}, which is not there"


def included_makefiles() -> list[Path]:
    """The make fragments the Makefile includes (``include $(wildcard <pattern>)``), as make finds them."""
    patterns = re.findall(r"^include \$\(wildcard (\S+)\)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    return sorted(path for pattern in patterns for path in ROOT.glob(pattern))


#: the targets that run Python: train, and those of the fragments the Makefile includes (each plug-in's)
PYTHON_TARGETS = [
    "train",
    *(
        target
        for targets in included_makefiles()
        for target in re.findall(r"^([\w-]+): \$\(STAMP\)", targets.read_text(), re.MULTILINE)
    ),
]


@pytest.mark.parametrize("target", PYTHON_TARGETS)
def test_args_adds_its_words_to_the_command_of_every_target_that_runs_python(target: str) -> None:
    """``make train CONFIG=... ARGS="--data.folder=..."``: the README's form for a folder of one's own."""
    printed = subprocess.run(
        [
            "make",
            "-s",
            "-n",
            "-C",
            str(ROOT),
            target,
            "CKPT=x.ckpt",
            'ARGS=--data.folder="my data" --seed 3',
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    command = shlex.split(printed.strip().splitlines()[-1])
    assert command[:2] == [".venv/bin/python", "-m"]
    assert command[-3:] == ["--data.folder=my data", "--seed", "3"]
