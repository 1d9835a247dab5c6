"""How ``make slim`` edits what names a plug-in it removes, shown on a made-up extra, ``board``: a config
loses whole entries (a stand-in takes a logger's place) and keeps the comments of what stays; a page loses
the rows, sentences, commands and sections that name it. The removals of the real plug-ins are proven in
tests/test_layout.py."""

import pytest

from scripts import plugins
from scripts.gone import Gone, naming
from scripts.slim_configs import edit_config
from scripts.slim_pages import edit_markdown
from tests.conftest import ROOT


def test_a_config_loses_whole_entries_and_keeps_the_comments_of_what_stays() -> None:
    text = (
        "# python -m src.cli fit --config configs/x.yaml\n"
        "trainer:\n"
        "  logger:                   # where the runs go\n"
        "    class_path: src.extras.board.Logger   # a run per stage\n"
        "    init_args: {save_dir: logs, every_s: 1}\n"
        "  callbacks:                # yours, after the sections\n"
        "    - class_path: src.extras.board.Samples   # in TensorBoard\n"
        "      init_args:\n"
        "        every_n_epochs: 1\n"
        "early_stopping:             # by val/loss\n"
        "  class_path: lightning.pytorch.callbacks.EarlyStopping\n"
        "# The extras\n"
        "board:\n"
        "  class_path: src.extras.board.Board\n"
        "figures: null               # off\n"
    )
    gone = Gone(ROOT, sections={"board"})
    gone.add("src/extras/board")
    gone.stand_ins["src.extras.board.Logger"] = plugins.StandIn(
        "lightning.pytorch.loggers.TensorBoardLogger", ()
    )
    kept = edit_config(text, gone, {}, whole=True)
    assert kept == (
        "# python -m src.cli fit --config configs/x.yaml\n"
        "trainer:\n"
        "  logger:                   # where the runs go\n"
        "    class_path: lightning.pytorch.loggers.TensorBoardLogger\n"
        "    init_args: {save_dir: logs, every_s: 1}\n"
        "  callbacks: []             # yours, after the sections\n"
        "early_stopping:             # by val/loss\n"
        "  class_path: lightning.pytorch.callbacks.EarlyStopping\n"
        "# The extras\n"  # it speaks of figures too, which stays
        "figures: null               # off\n"
    )
    experiment = "data:\n  class_path: src.extras.board.Data\n"
    assert edit_config(experiment, gone, {}, whole=True) is None  # its data went: it goes whole
    assert edit_config("data: {path: x.csv}\n", gone, {"data": {"class_path": "src.extras.board.D"}}) is None
    with pytest.raises(plugins.SlimError):  # on a line shared with what stays: not one make slim takes off
        edit_config("trainer: {max_epochs: 3, strategy: src.extras.board.S}\n", gone, {})


def test_a_page_loses_rows_sentences_commands_and_sections_that_name_what_went() -> None:
    page = (
        "# Title\n\n"
        "- [Kept](#kept)\n"
        "- [Gone](#gone): a section\n\n"
        "## Kept\n\n"
        "First sentence stays. The board draws ([its page](src/extras/board/README.md)). Last stays.\n\n"
        "**Boards.** [The board](src/extras/board/README.md) draws charts; a second clause:\n\n"
        "```bash\n"
        "make train\n"
        "```\n\n"
        "```bash\n"
        "make train   # stays\n"
        "make board CKPT=x   # goes\n"
        "```\n\n"
        "## Gone\n\n"
        "| extra | page |\n"
        "|---|---|\n"
        "| board | [src/extras/board/README.md](src/extras/board/README.md) |\n"
    )
    gone = Gone(ROOT, targets={"board"})
    gone.add("src/extras/board")
    text, lost = edit_markdown("README.md", page, gone, {})
    assert lost == {"gone"}
    gone.anchors["README.md"] = lost  # a second pass, as make slim makes: the links to what went go
    text, _ = edit_markdown("README.md", text, gone, {})
    assert text == (
        "# Title\n\n"
        "- [Kept](#kept)\n\n"
        "## Kept\n\n"
        "First sentence stays. Last stays.\n\n"
        "```bash\n"
        "make train   # stays\n"
        "```\n"
    )


def test_a_section_is_named_by_its_cli_word_its_yaml_key_or_in_backticks_and_never_as_a_plain_word() -> None:
    pattern = naming(frozenset(), frozenset(), frozenset({"resume", "baselines"}))
    named = [
        "--resume=null",
        "baselines: null",
        "  resume:\n",
        "`baselines: null` skips them",
        "the `resume` section",
    ]
    plain = ["a fit can resume: from last.ckpt", "the baselines fit beside the net", "--resumed", "`resumed`"]
    assert [text for text in named if pattern.search(text)] == named
    assert [text for text in plain if pattern.search(text)] == []


def test_a_folder_may_use_one_already_removed_but_not_need_one(tmp_path) -> None:
    """``uses`` names what make slim removes without the folder that uses it (serve reads image checkpoints
    only where the images extra is kept): once gone, it is no longer used; ``needs`` must be there."""
    app = tmp_path / "src" / "apps" / "serve"
    app.mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "plugin.toml").write_text('needs = []\nuses = ["images"]\n')
    assert plugins.plugins(tmp_path)["serve"].uses == frozenset()
    (app / "plugin.toml").write_text('needs = ["images"]\n')
    with pytest.raises(plugins.SlimError, match=r"src/apps/serve/plugin.toml names \['images'\], no folder"):
        plugins.plugins(tmp_path)
