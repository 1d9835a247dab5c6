"""Figures of validation results, drawn with matplotlib alone (no Lightning, no torch), so that a worker
process (:mod:`src.extras.workers`) draws them while the training goes on: the confusion matrix and predicted
against true values, as RGB pixels and Markdown text for TensorBoard.
"""

import math
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # imported where a figure is made: a process that only sends drawings never imports it
    from matplotlib.figure import Figure

DPI = 100
#: the confusion matrix's side, in inches, before the cell-size bounds apply (10 classes: 0.6 in a cell)
CONFUSION_SIDE_IN = 6.0
MIN_CELL_IN, MAX_CELL_IN = 0.16, 1.0
#: cells smaller than this show no text, and from this size on both the count and the rate
MIN_TEXT_CELL_IN, BOTH_TEXT_CELL_IN = 0.2, 0.45
#: labels longer than this are wrapped (few classes) or numbered with a legend (many)
LABEL_CHARS = 12
WRAP_MAX_CLASSES = 8
#: a character's mean width in the default font, in em: label lengths are estimated, not measured
CHAR_EM = 0.62
TITLE_FONT = 9.0
#: a panel's side in a grid of panels (one per label or output), in inches, and the most panels drawn
PANEL_IN = 2.2
MAX_PANELS = 36


@dataclass
class Drawn:
    """What one drawing gives TensorBoard: ``(H, W, 3)`` uint8 pixels under ``tag``, and Markdown texts by
    tag."""

    tag: str
    pixels: np.ndarray
    texts: dict[str, str]


def new_figure(image_size: int) -> "Figure":
    """A bare Figure of ``image_size`` pixels a side, not pyplot's: no global state, no display backend,
    safe on any thread or process."""
    from matplotlib.figure import Figure

    inches = image_size / DPI
    return Figure(figsize=(inches, inches), dpi=DPI)


def pixels(figure: "Figure") -> np.ndarray:
    """The figure rendered: ``(H, W, 3)`` uint8, as TensorBoard's ``add_figure`` renders one."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[:, :, :3].copy()


def validation(
    group: str,
    title: str,
    counts: np.ndarray | None = None,
    labels: list[str] | None = None,
    preds: np.ndarray | None = None,
    target: np.ndarray | None = None,
    figure: "Figure | None" = None,
    image_size: int = 480,
) -> Drawn:
    """One validation epoch's figure under ``<group>/…``: the confusion matrix of ``(K, K)`` ``counts``
    (one class of K: rows true, columns predicted), or one 2x2 matrix per label of ``(K, 2, 2)`` ``counts``
    (K labels, each 0 or 1), each with its counts as a Markdown table; or ``preds`` against ``target``,
    ``(N,)`` or ``(N, K)`` (a panel per output, named by ``labels``). Drawn into ``figure``, or a new one of
    ``image_size`` pixels."""
    figure = figure if figure is not None else new_figure(image_size)
    if counts is not None and np.ndim(counts) == 3:
        labels = labels or [str(k) for k in range(len(counts))]
        label_matrices_figure(figure, np.asarray(counts), labels, title)
        text = {f"{group}/confusion_counts": label_counts_table(np.asarray(counts), labels)}
        return Drawn(f"{group}/confusion_matrix", pixels(figure), text)
    if counts is not None:
        labels = labels or [str(k) for k in range(len(counts))]
        confusion_figure(figure, counts, labels, title)
        text = {f"{group}/confusion_counts": markdown_table(counts, labels)}
        return Drawn(f"{group}/confusion_matrix", pixels(figure), text)
    assert preds is not None
    assert target is not None
    figure.set_layout_engine("constrained")
    if np.ndim(preds) == 2:  # (N, K): a panel per output
        k = preds.shape[1]
        names = labels if labels is not None and len(labels) == k else [str(j) for j in range(k)]
        shown = min(k, MAX_PANELS)
        columns = math.ceil(math.sqrt(shown))
        rows = math.ceil(shown / columns)
        side = figure.get_figwidth()
        figure.set_size_inches(max(side, columns * PANEL_IN), max(side, rows * PANEL_IN))
        for j in range(shown):
            ax = figure.add_subplot(rows, columns, j + 1)
            _scatter(ax, np.asarray(target)[:, j], np.asarray(preds)[:, j], legend=j == 0)
            ax.set_title(names[j], fontsize=TITLE_FONT)
        figure.suptitle(title if shown == k else f"{title} (the first {shown} of {k} outputs)")
        return Drawn(f"{group}/predicted_vs_true", pixels(figure), {})
    ax = figure.add_subplot()
    _scatter(ax, np.asarray(target), np.asarray(preds))
    ax.set_title(title)
    return Drawn(f"{group}/predicted_vs_true", pixels(figure), {})


def label_matrices_figure(figure: "Figure", counts: np.ndarray, labels: list[str], title: str) -> None:
    """Draw one 2x2 matrix per label of ``(K, 2, 2)`` ``counts`` (rows true 0/1, columns predicted 0/1) into
    ``figure``, in a grid, each coloured by its row-normalized rate and titled with its label; at most
    :data:`MAX_PANELS` of them (the Markdown table holds every label's)."""
    k = len(counts)
    shown = min(k, MAX_PANELS)
    columns = math.ceil(math.sqrt(shown))
    rows = math.ceil(shown / columns)
    figure.set_size_inches(columns * PANEL_IN, rows * PANEL_IN + 0.5)
    figure.set_layout_engine("constrained")
    for j in range(shown):
        ax = figure.add_subplot(rows, columns, j + 1)
        matrix = counts[j].astype(np.float64)
        rates = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)  # (2, 2), rows sum to 1
        ax.imshow(rates, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_xticks([0, 1], ["0", "1"], fontsize=8)
        ax.set_yticks([0, 1], ["0", "1"], fontsize=8)
        ax.set_xlabel("predicted", fontsize=8)
        ax.set_ylabel("true", fontsize=8)
        label = labels[j] if len(labels[j]) <= 2 * LABEL_CHARS else labels[j][: 2 * LABEL_CHARS - 1] + "…"
        ax.set_title(label, fontsize=TITLE_FONT)
        for (i, m), count in np.ndenumerate(counts[j]):
            colour = "white" if rates[i, m] > 0.5 else "black"
            ax.text(m, i, str(int(count)), ha="center", va="center", fontsize=8, color=colour)
    more = "" if shown == k else f" (the first {shown} of {k} labels)"
    figure.suptitle(f"{title}{more}\ncolour: share of the true value", fontsize=TITLE_FONT)


def confusion_figure(figure: "Figure", counts: Any, labels: list[str], title: str) -> None:
    """Draw (K, K) ``counts`` (rows true, columns predicted) into ``figure``, sized to the class count.

    Each cell's colour is its row-normalized rate (the share of the true class predicted so); a non-zero
    cell also says its count and rate when the cell is large enough to hold them. Labels longer than
    :data:`LABEL_CHARS` are wrapped onto two lines when there are few classes, and replaced by their class
    number with a legend beside the matrix otherwise. The layout is computed from the class count and
    the label lengths, not by a layout engine: a constrained layout costs more than the drawing itself.
    """
    counts = np.asarray(counts)  # (K, K); a CPU tensor too
    k = len(counts)
    matrix = counts.astype(np.float64)
    rates = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)  # (K, K), rows sum to 1
    cell = min(max(CONFUSION_SIDE_IN / k, MIN_CELL_IN), MAX_CELL_IN)  # inches
    font = min(max(cell * 72 * 0.45, 5.0), 10.0)  # points: tick labels fit their cell
    shown, legend = _tick_labels(labels)
    lines = max(label.count("\n") + 1 for label in shown)
    longest = max(len(line) for label in shown for line in label.split("\n"))
    text_in = longest * CHAR_EM * font / 72  # the longest label line's length, in inches
    rotate = text_in > cell * 0.9 or (lines > 1 and k > WRAP_MAX_CLASSES)
    side = k * cell
    left = text_in + 0.55  # tick labels, then the axis label
    bottom = (text_in if rotate else lines * font * 1.3 / 72) + 0.55
    heading = f"{title}\ncolour: share of the true class"
    top = 0.65  # the two lines of the title
    legend_font = 8.0
    rows_per_column = max(int((side + bottom) * 72 / (legend_font * 1.35)), 1)
    columns = -(-len(legend) // rows_per_column) if legend else 0
    entry_in = max((len(entry) for entry in legend), default=0) * CHAR_EM * legend_font / 72
    legend_in = columns * (entry_in + 0.2)
    # wide enough for the title over a matrix of two or three classes
    title_in = max(len(line) for line in heading.split("\n")) * CHAR_EM * TITLE_FONT / 72
    width, height = (
        max(left + side + 0.3 + legend_in, left + side / 2 + title_in / 2 + 0.2),
        bottom + side + top,
    )
    figure.set_size_inches(width, height)
    ax = figure.add_axes((left / width, bottom / height, side / width, side / height))
    ax.imshow(rates, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
    ticks = list(range(k))
    ax.set_xticks(ticks, shown, rotation=90 if rotate else 0, fontsize=font)
    ax.set_yticks(ticks, shown, fontsize=font)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(heading, fontsize=TITLE_FONT)
    _annotate(ax, counts, rates, cell)
    if legend:
        for column in range(columns):
            block = legend[column * rows_per_column : (column + 1) * rows_per_column]
            x = (left + side + 0.3 + column * legend_in / columns) / width
            figure.text(x, 1 - top / height, "\n".join(block), va="top", ha="left", fontsize=legend_font)


def _tick_labels(labels: list[str]) -> tuple[list[str], list[str]]:
    """The labels as shown on the axes, and the legend lines (empty when the labels are shown whole)."""
    if all(len(label) <= LABEL_CHARS for label in labels):
        return labels, []
    if len(labels) <= WRAP_MAX_CLASSES and all(len(label) <= 2 * LABEL_CHARS for label in labels):
        return ["\n".join(textwrap.wrap(label, LABEL_CHARS)[:2]) or label for label in labels], []
    return [str(k) for k in range(len(labels))], [f"{k}: {label}" for k, label in enumerate(labels)]


def _annotate(ax: Any, counts: np.ndarray, rates: np.ndarray, cell: float) -> None:
    """Count and rate in the non-zero cells that can hold them (text in empty cells is most of the cost)."""
    if cell < MIN_TEXT_CELL_IN:
        return
    both = cell >= BOTH_TEXT_CELL_IN
    font = min(max(cell * 72 * (0.22 if both else 0.35), 5.0), 10.0)
    for i, j in np.argwhere(counts).tolist():
        rate = float(rates[i, j])
        text = f"{int(counts[i, j])}\n{rate:.0%}" if both else f"{int(counts[i, j])}"
        colour = "white" if rate > 0.5 else "black"
        ax.text(j, i, text, ha="center", va="center", fontsize=font, color=colour)


def _scatter(ax: Any, target: np.ndarray, preds: np.ndarray, legend: bool = True) -> None:
    ax.scatter(target, preds, s=8, alpha=0.5)
    low, high = float(min(target.min(), preds.min())), float(max(target.max(), preds.max()))
    ax.plot([low, high], [low, high], color="black", linewidth=1, label="predicted = true")
    ax.set_xlabel("true value")
    ax.set_ylabel("predicted value")
    if legend:
        ax.legend(loc="upper left")


def _escaped(labels: list[str]) -> list[str]:
    """A label is data: escape what Markdown would read as a cell border or emphasis."""
    return [label.replace("|", "\\|").replace("*", "\\*").replace("_", "\\_") for label in labels]


def label_counts_table(counts: np.ndarray, labels: list[str]) -> str:
    """(K, 2, 2) counts as a Markdown table, one row per label: its true negatives, false positives, false
    negatives and true positives (scikit-learn's ``multilabel_confusion_matrix`` order, row by row)."""
    header = (
        "| label | true 0, predicted 0 | true 0, predicted 1 | true 1, predicted 0 | true 1, predicted 1 |"
    )
    body = [
        f"| {label} | " + " | ".join(str(int(n)) for n in matrix.ravel()) + " |"
        for label, matrix in zip(_escaped(labels), np.asarray(counts), strict=True)
    ]
    return "\n".join([header, "|---" * 5 + "|", *body])


def markdown_table(counts: np.ndarray, labels: list[str]) -> str:
    """(K, K) counts as a Markdown table, true class per row, predicted class per column."""
    rows = np.asarray(counts).tolist()
    labels = _escaped(labels)
    header = "| true \\ predicted | " + " | ".join(labels) + " |"
    rule = "|---" * (len(rows) + 1) + "|"
    body = [
        f"| {label} | " + " | ".join(str(n) for n in row) + " |"
        for label, row in zip(labels, rows, strict=True)
    ]
    return "\n".join([header, rule, *body])
