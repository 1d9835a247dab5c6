"""TensorBoard on a finished run, rendered by headless Chromium: what a person sees when they open it.

Needs Debian's ``chromium`` (``apt-get install -y chromium``); skipped with that sentence where it is
missing. Each tab is rendered to a PNG at the window's full size; what the page shows is checked from the
same endpoints its scripts read (the tabs draw into shadow DOM, which ``--dump-dom`` does not print), with
the page's own rules: Time Series sorts every tag naturally, groups them by what precedes the first ``/``
and opens the first two groups; HParams shows the first five hyperparameters (those marked as differing
first) and the first five metrics. ``BROWSER_SCREENSHOTS=docs/images`` keeps the screenshots there.
"""

import functools
import io
import os
import shutil
import subprocess
import tempfile
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from src.extras.dashboard import HEADLINE
from src.extras.dashboard.test_tensorboard_server import (  # noqa: F401
    OPENER,
    finished_run,
    request,
    server,
    session_groups,
)

# these tests also need the extras below; without one of them they are skipped
drawing_extra = pytest.importorskip("src.extras.figures.drawing")
DPI, confusion_figure = drawing_extra.DPI, drawing_extra.confusion_figure


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium: install it with `apt-get install -y chromium`"),
]
WINDOW = (1400, 1000)
RENDER_TIMEOUT_S = 90
#: Time Series opens this many tag groups, the first ones in its order
OPENED_GROUPS = 2
#: HParams shows this many hyperparameter and metric columns at first
SHOWN_COLUMNS = 5


def screenshot(url: str, path: Path) -> Image.Image:
    """``url`` rendered by headless Chromium after its scripts ran, as a PNG at ``path``."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", f"--user-data-dir={profile}",
                f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars",
                "--virtual-time-budget=30000", f"--screenshot={path}", url,
            ],
            check=True, capture_output=True, timeout=RENDER_TIMEOUT_S,
        )  # fmt: skip
    return Image.open(path)


def busy(image: Image.Image) -> float:
    """The share of pixels that are not the page's white: a tab that drew nothing is all white."""
    pixels = np.asarray(image.convert("L"))
    return float((pixels < 245).mean())


def natural(a: str, b: str) -> int:
    """Time Series' order of tags: ``/`` and digits before any other character, numbers by value."""

    def special(c: str) -> bool:
        return c == "/" or c.isdigit()

    i = j = 0
    while True:
        if i == len(a):
            return 0 if j == len(b) else -1
        if j == len(b):
            return 1
        if a[i].isdigit() and b[j].isdigit():
            ni, nj = i, j
            while ni < len(a) and a[ni].isdigit():
                ni += 1
            while nj < len(b) and b[nj].isdigit():
                nj += 1
            if int(a[i:ni]) != int(b[j:nj]):
                return -1 if int(a[i:ni]) < int(b[j:nj]) else 1
            i, j = ni, nj
            continue
        if special(a[i]) != special(b[j]):
            return -1 if special(a[i]) else 1
        if a[i] != b[j]:
            return -1 if a[i] < b[j] else 1
        i, j = i + 1, j + 1


def opened_groups(port: int) -> list[str]:
    """The tag groups Time Series opens on: of every scalar, image and histogram tag of every run."""
    tags = {
        tag
        for plugin in ("scalars", "images", "histograms")
        for run_tags in request(port, f"/data/plugin/{plugin}/tags").values()  # type: ignore[attr-defined]
        for tag in run_tags
    }
    groups = list(
        dict.fromkeys(tag.split("/", 1)[0] for tag in sorted(tags, key=functools.cmp_to_key(natural)))
    )
    return groups[:OPENED_GROUPS]


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    kept = os.environ.get("BROWSER_SCREENSHOTS")
    return Path(kept) if kept else tmp_path


def test_the_time_series_order_is_the_pages() -> None:
    tags = ["test/acc", "metrics/loss", "metrics/acc_hgb", "metrics/acc", "epoch10/x", "epoch9/x", "a/b"]
    assert sorted(tags, key=functools.cmp_to_key(natural)) == [
        "a/b", "epoch9/x", "epoch10/x", "metrics/acc", "metrics/acc_hgb", "metrics/loss", "test/acc",
    ]  # fmt: skip


def test_each_tab_shows_what_a_person_looks_for(server, finished_run, shots: Path) -> None:  # noqa: F811
    port, _ = server
    _, run_name, metrics = finished_run
    base = f"http://127.0.0.1:{port}/"

    # Time Series opens on the training curves: train and validation on one chart, each run a colour
    assert opened_groups(port) == ["metrics", "optimization"]
    tags = request(port, "/data/plugin/scalars/tags")
    runs_of_loss = [run for run, names in tags.items() if "metrics/loss" in names]  # type: ignore[attr-defined]
    assert sorted(runs_of_loss) == [f"{run_name}/{stage}" for stage in ("test", "train", "validation")]
    # one run per fit in the run list (its stages below it), none beside it
    assert sorted(request(port, "/data/runs")) == sorted([run_name, *runs_of_loss])  # type: ignore[arg-type]
    scalars = screenshot(base + "#timeseries", shots / "tensorboard-time-series.png")
    assert scalars.size == WINDOW
    assert busy(scalars) > 0.05

    # clipping as a share of each interval's steps: a number from 0 to 1, not a 0/1 flag
    query = urllib.parse.urlencode({"run": f"{run_name}/train", "tag": "optimization/clipped"})
    clipped = [value for _, _, value in request(port, f"/data/plugin/scalars/scalars?{query}")]  # type: ignore[union-attr]
    assert clipped
    assert all(0 <= value <= 1 for value in clipped)

    # Custom Scalars: each metric's chart over the stage runs
    layout = request(port, "/data/plugin/custom_scalars/layout")
    titles = [chart["title"] for cat in layout["category"] for chart in cat["chart"]]  # type: ignore[index]
    assert titles[:3] == ["loss", "acc", "f1"]
    custom = screenshot(base + "#custom_scalars", shots / "tensorboard-custom-scalars.png")
    assert busy(custom) > 0.05

    # Images: the best epoch's confusion matrix, decoded at the full size the event says
    [entry, *_] = request(
        port,
        "/data/plugin/images/images?"
        + urllib.parse.urlencode({"run": run_name, "tag": "summary/confusion_matrix"}),
    )  # type: ignore[misc]
    with OPENER.open(f"{base}data/plugin/images/individualImage?{entry['query']}") as png:
        decoded = Image.open(io.BytesIO(png.read()))
    figure = Figure(dpi=DPI)
    confusion_figure(figure, torch.eye(10, dtype=torch.long), [str(k) for k in range(10)], "validation")
    assert decoded.size == tuple(int(inches * DPI) for inches in figure.get_size_inches())
    assert decoded.width >= 600  # cells large enough to read
    images = screenshot(base + "#images", shots / "tensorboard-images.png")
    assert busy(images) > 0.05

    # HParams: at most 15 hyperparameters, the headline five shown; the best epoch's values first
    experiment = request(port, "/data/plugin/hparams/experiment", {"experimentName": ""})
    infos = experiment["hparamInfos"]  # type: ignore[index]
    assert len(infos) <= 15
    shown = sorted(infos, key=lambda info: not info.get("differs", False))[:SHOWN_COLUMNS]
    assert {info["name"] for info in shown} == set(HEADLINE)
    first = [m["name"]["tag"] for m in experiment["metricInfos"][:SHOWN_COLUMNS]]  # type: ignore[index]
    assert first == [
        "summary/best_loss",
        "summary/best_acc",
        "summary/best_f1",
        "summary/best_epoch",
        "metrics/loss",
    ]
    [group] = [g for g in session_groups(port) if g["name"] == run_name]
    values = {(m["name"].get("group", ""), m["name"]["tag"]): m["value"] for m in group["metricValues"]}
    assert values[("test", "metrics/acc")] == pytest.approx(metrics["test/acc"])
    hparams = screenshot(base + "#hparams", shots / "tensorboard-hparams.png")
    assert busy(hparams) > 0.02
