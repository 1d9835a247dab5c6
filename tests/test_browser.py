"""TensorBoard on a finished run, rendered by headless Chromium: what a person sees when they open it.

Needs Debian's ``chromium`` (``sudo apt-get install -y chromium``); skipped with
that sentence where it is missing. Each tab is rendered to a PNG at the window's full size; what the page
shows comes from the same endpoints its scripts read (the tabs draw into shadow DOM, which
``--dump-dom`` does not print). ``BROWSER_SCREENSHOTS=docs/images`` keeps the screenshots there.
"""

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

from src.callbacks.dashboard import SESSION_FOLDER
from src.callbacks.figures import DPI, confusion_figure
from tests.test_tensorboard_server import OPENER, STATUSES, finished_run, request, server  # noqa: F401

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None, reason="no chromium: install it with `sudo apt-get install -y chromium`"
    ),
]
WINDOW = (1400, 1000)
RENDER_TIMEOUT_S = 90


def screenshot(url: str, path: Path) -> Image.Image:
    """``url`` rendered by headless Chromium after its scripts ran, as a PNG at ``path``."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", f"--user-data-dir={profile}",
                f"--window-size={WINDOW[0]},{WINDOW[1]}", "--hide-scrollbars",
                "--virtual-time-budget=15000", f"--screenshot={path}", url,
            ],
            check=True, capture_output=True, timeout=RENDER_TIMEOUT_S,
        )  # fmt: skip
    return Image.open(path)


def busy(image: Image.Image) -> float:
    """The share of pixels that are not the page's white: a tab that drew nothing is all white."""
    pixels = np.asarray(image.convert("L"))
    return float((pixels < 245).mean())


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    kept = os.environ.get("BROWSER_SCREENSHOTS")
    return Path(kept) if kept else tmp_path


def test_each_tab_renders_what_a_person_looks_for(server, finished_run, shots: Path) -> None:  # noqa: F811
    port, _ = server
    _, run_name, metrics = finished_run
    base = f"http://127.0.0.1:{port}/"

    # Time Series: the train and val groups, drawn
    tags = request(port, "/data/plugin/scalars/tags")[run_name]  # type: ignore[index]
    assert {"train/loss", "val/loss", "val/acc"} <= set(tags)
    assert "epoch" not in tags  # not the first chart a person sees
    scalars = screenshot(base + "#timeseries", shots / "tensorboard-time-series.png")
    assert scalars.size == WINDOW
    assert busy(scalars) > 0.05

    # Images: the confusion matrix, decoded at the full size the event says
    [entry, *_] = request(
        port,
        "/data/plugin/images/images?"
        + urllib.parse.urlencode({"run": run_name, "tag": "val/confusion_matrix"}),
    )  # type: ignore[misc]
    with OPENER.open(f"{base}data/plugin/images/individualImage?{entry['query']}") as png:
        decoded = Image.open(io.BytesIO(png.read()))
    # the size the drawing gives ten digit classes, untouched by TensorBoard on its way to the page
    figure = Figure(dpi=DPI)
    confusion_figure(figure, torch.eye(10, dtype=torch.long), [str(k) for k in range(10)], "validation")
    assert decoded.size == tuple(int(inches * DPI) for inches in figure.get_size_inches())
    assert decoded.width >= 600  # cells large enough to read
    images = screenshot(base + "#images", shots / "tensorboard-images.png")
    assert busy(images) > 0.05

    # HParams: the chosen metric columns, the test metrics among them
    groups = request(
        port,
        "/data/plugin/hparams/session_groups",
        {
            "experimentName": "",
            "startIndex": 0,
            "sliceSize": 10,
            "includeMetrics": True,
            "allowedStatuses": STATUSES,
        },
    )["sessionGroups"]  # type: ignore[index]
    [group] = [g for g in groups if g["name"] == run_name]
    values = {m["name"]["tag"]: m["value"] for m in group["metricValues"]}
    assert {"val/best_loss", "val/best_epoch", "val/best_acc", "test/acc"} <= set(values)
    assert values["test/acc"] == pytest.approx(metrics["test/acc"])
    assert group["sessions"][0]["name"] == f"{run_name}/{SESSION_FOLDER}"
    hparams = screenshot(base + "#hparams", shots / "tensorboard-hparams.png")
    assert busy(hparams) > 0.02
