"""Core, extras and apps apart. The core (``src/`` outside ``src/extras/`` and ``src/apps/``) imports and
names no extra or app. Each folder of those two says in its ``plugin.toml`` what it needs, and imports only
the core, what it declares and the modules beside the folders; every config entry that names one is one
that ``make slim`` (``scripts/slim.py``) takes off. The slow proofs take each one off in a copy of the
repository with the code of ``make slim`` and run the core's suite and every remaining config there, and
run ``make slim`` itself in a scratch repository, which then lints, passes its suite and links."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scripts import links, plugins, slim
from scripts.gone import Gone, module_words
from tests.conftest import ROOT

SRC = ROOT / "src"
FOUND = plugins.plugins(ROOT)
#: what a copy of the repository leaves out: environments, caches, runs, generated data and results
NOT_COPIED = {".git", ".venv", "logs", "lightning_logs", "data", "benchmarks/results", ".hypothesis"}


def folder_of(module: str) -> str | None:
    """The extra or app a module belongs to; ``None`` for the core and the modules beside the folders."""
    parts = module.split(".")
    inside = parts[:2] in (["src", "extras"], ["src", "apps"]) and len(parts) > 2
    return parts[2] if inside and parts[2] in FOUND else None


def is_test(path: Path) -> bool:
    return path.name.startswith("test_") or path.name == "conftest.py"


def core_files() -> list[Path]:
    return [
        path
        for path in SRC.rglob("*.py")
        if not plugins.module_of(path, ROOT).startswith(("src.apps", "src.extras"))
    ]


def test_every_extra_and_app_says_what_it_needs() -> None:
    """``plugins`` reads each folder's ``plugin.toml`` and refuses a folder without one, a name it does not
    know, or two folders of one name (KEEP names folders)."""
    folders = sorted(
        path.parent.name for kind in plugins.KINDS for path in (SRC / kind).glob("*/__init__.py")
    )
    assert sorted(FOUND) == folders  # none, once make slim has run


def test_the_core_imports_and_names_no_extra_or_app() -> None:
    core = core_files()
    assert len(core) > 15
    naming = re.compile(r"src[./](extras|apps)\b")
    for path in core:
        found = naming.search(path.read_text())
        assert found is None, f"{path.relative_to(ROOT)} names {found.group(0)}: the core must not know them"


def test_each_extra_and_app_imports_only_the_core_and_what_it_declares() -> None:
    """Its code (its tests aside: one that needs another skips without it) imports no other folder but
    those its ``plugin.toml`` names; each folder it ``needs`` it does import, so that KEEP keeps no more
    than it must; and the modules beside the folders import none of them."""
    for plugin in FOUND.values():
        used: set[str] = set()
        for path in (ROOT / plugin.folder).rglob("*.py"):
            if is_test(path):
                continue
            others = {folder_of(module) for module in plugins.imported(path, ROOT)} - {None, plugin.name}
            undeclared = others - plugin.needs - plugin.uses
            assert not undeclared, (
                f"{path.relative_to(ROOT)} imports {sorted(undeclared)}, which its plugin.toml does not name"
            )
            used |= {name for name in others if name is not None}
        assert plugin.needs <= used, (
            f"{plugin.folder}/plugin.toml needs {sorted(plugin.needs - used)}, which it never imports"
        )
    for path in plugins.shared_modules(ROOT).values():
        folders = {folder_of(module) for module in plugins.imported(path, ROOT)} - {None}
        assert not folders, f"{path.relative_to(ROOT)}, shared, imports {sorted(folders)}"


def trimmed(name: str) -> tuple[Gone, dict[str, str | None]]:
    """What make slim would write to ``configs/`` with ``name`` (and what needs it) taken off."""
    kept = [FOUND[other] for other in sorted(plugins.all_but(name, FOUND))]
    removed = [plugin for plugin in FOUND.values() if plugin not in kept]
    gone = slim.gone_with(ROOT, removed, kept)
    tree = [file for file in slim.files(ROOT) if not gone.has(file)]
    defaults = yaml.safe_load((ROOT / slim.DEFAULTS).read_text())
    return gone, slim.trim_configs(ROOT, tree, gone, defaults)


@pytest.mark.parametrize("name", sorted(FOUND))
def test_every_config_entry_that_names_one_comes_off(name: str) -> None:
    """Each config names an extra or app only in entries make slim takes off (a section, a trainer entry or
    list item; a class with a stand-in becomes Lightning's), or it is that one's experiment and goes whole;
    the README's table has its row."""
    gone, written = trimmed(name)  # raises for an entry that cannot come off
    names = module_words(gone)
    for config, text in written.items():
        assert text is None or not names(yaml.safe_load(text)), config
    for plugin in FOUND.values():
        if plugin.name not in plugins.all_but(name, FOUND):
            for source, stand_in in plugin.stand_ins:
                for config, text in written.items():
                    if text is not None and source in (ROOT / config).read_text():
                        assert stand_in.class_path in text, f"{config}: {source} has no stand-in"
    plugin = FOUND[name]
    assert f"({plugin.folder}/README.md)" in (ROOT / "README.md").read_text()  # its row


def test_make_slim_refuses_a_tree_with_uncommitted_changes(tmp_path: Path) -> None:
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.txt").write_text("a\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True)
    slim.refuse_unless_committed(tmp_path)  # clean: goes ahead
    (tmp_path / "my_data.csv").write_text("b\n")  # a file of the user's that make slim never touches
    slim.refuse_unless_committed(tmp_path)
    mine = tmp_path / "src" / "extras" / "mine" / "notes.txt"  # inside a folder make slim may remove
    mine.parent.mkdir(parents=True)
    mine.write_text("c\n")
    with pytest.raises(plugins.SlimError, match=r"uncommitted change.*src/extras/.*git checkout -- \."):
        slim.refuse_unless_committed(tmp_path)
    mine.unlink()
    (tmp_path / "a.txt").write_text("changed\n")  # a change to a file make slim may edit
    with pytest.raises(plugins.SlimError, match=r"1 uncommitted change.*a\.txt"):
        slim.refuse_unless_committed(tmp_path)


def test_every_link_of_the_readme_and_the_docs_leads_to_a_file_and_a_heading() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    problems = [problem for page in pages for problem in links.broken(page)]
    assert not problems, problems


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A page\n\n## Two words\n\n```bash\n# not a heading\n```\n")
    (tmp_path / "b.md").write_text(
        "[ok](a.md#two-words) [ok](#b) [no file](c.md) [no heading](a.md#not-a-heading)\n"
        "[web](https://example.com)\n\n# B\n"
    )
    assert [problem.split(": ")[1] for problem in links.broken(tmp_path / "b.md")] == [
        "the link c.md leads to no file",
        "the link a.md#not-a-heading leads to no heading of a.md",
    ]


# -- the proofs: each one off, then the core's suite and every config in a copy ---------------------------


def not_copied(folder: str, names: list[str]) -> set[str]:
    where = Path(folder).relative_to(ROOT)
    return {
        name
        for name in names
        if (where / name).as_posix() in NOT_COPIED or name == "__pycache__" or name.endswith("_cache")
    }


def copy_of(tmp_path: Path) -> Path:
    """The working tree copied, with the environment a checkout has after ``make install`` (``.venv``, which
    the hooks of ``.pre-commit-config.yaml`` name) linked in rather than copied."""
    copy = tmp_path / "repository"
    shutil.copytree(ROOT, copy, ignore=not_copied)
    if (ROOT / ".venv").is_dir():
        (copy / ".venv").symlink_to(ROOT / ".venv")
    return copy


def run(words: list[str], where: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(words, cwd=where, env=env, capture_output=True, text=True)


def the_core_passes(copy: Path) -> None:
    """Every config of ``configs/`` fits (one step) and the core's quick suite passes, in ``copy``."""
    configs = sorted(str(path) for path in (copy / "configs").glob("*.yaml") if path.name != "defaults.yaml")
    assert configs
    fits = (
        "import sys\nfrom src.cli import main\n"
        "for config in sys.argv[1:]:\n"
        "    main(['fit', '--config', config, '--trainer.fast_dev_run=1',\n"
        "          '--trainer.enable_progress_bar=false'])\n"
    )
    done = run([sys.executable, "-c", fits, *configs], copy)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    words = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "not slow", "-n", "auto"]
    done = run([*words, "--dist", "loadfile", "tests"], copy)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]


def named_in_what_make_slim_edits(copy: Path, done: slim.Slimmed) -> list[str]:
    edited = ("README.md", "Makefile", "configs/", "docs/")
    return [line for line in done.naming if line.startswith(edited)]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FOUND))
def test_the_core_stands_without_each_extra_and_app(name: str, tmp_path: Path) -> None:
    """In a copy: ``name`` (and what needs it) taken off by make slim's code, everything else kept; then
    the README, the docs, the configs and the Makefile name none of it, its make targets are gone, every
    remaining config fits and the core's quick suite passes."""
    copy = copy_of(tmp_path)
    done = slim.slim(copy, plugins.all_but(name, FOUND))
    assert name in {plugin.name for plugin in done.removed}
    assert not (copy / FOUND[name].folder).exists()
    assert not named_in_what_make_slim_edits(copy, done), done.naming
    app_mk = ROOT / FOUND[name].folder / "app.mk"
    for target in re.findall(r"^([\w-]+):", app_mk.read_text(), re.MULTILINE) if app_mk.is_file() else []:
        made = run(["make", "-s", "-n", target], copy)
        assert f"No rule to make target '{target}'" in made.stderr
    the_core_passes(copy)


@pytest.mark.slow
def test_make_slim_leaves_a_core_that_lints_passes_its_suite_and_links(tmp_path: Path) -> None:
    """``make slim`` in a scratch repository (the working tree, committed): what is left lints as ``make
    lint`` does, its every config fits, the core's suite passes, the README's and the docs' links lead
    somewhere; ``git checkout -- .`` brings back the whole tree."""
    copy = copy_of(tmp_path)
    git = ["git", "-c", "user.name=slim", "-c", "user.email=slim@example.com"]
    for words in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "scratch"]):
        assert run([*git, *words], copy).returncode == 0
    # the environment is this one (-o: make trusts it as installed)
    done = run(["make", "-o", ".venv/.installed", "slim", f"PY={sys.executable}"], copy)
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    assert "src/ now holds" in done.stdout
    assert not [path for kind in plugins.KINDS for path in (copy / "src" / kind).glob("*/__init__.py")]
    tools = Path(sys.executable).parent
    for words in (
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy", "src", "examples", "benchmarks", "scripts"],
    ):
        linted = run([str(tools / words[0]), *words[1:]], copy)
        assert linted.returncode == 0, f"{' '.join(words)}:\n{linted.stdout[-3000:]}{linted.stderr[-2000:]}"
    pages = [copy / "README.md", *sorted((copy / "docs").glob("*.md"))]
    assert not [problem for page in pages for problem in links.broken(page)]
    the_core_passes(copy)
    status = run(["git", "status", "--porcelain"], copy).stdout.splitlines()
    assert status
    assert all(line[:2] in {" D", " M"} for line in status), status  # nothing new written
    assert run(["git", "checkout", "--", "."], copy).returncode == 0
    assert run(["git", "status", "--porcelain"], copy).stdout == ""
