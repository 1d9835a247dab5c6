"""Checks of the encoded tensors a :class:`~src.extras.tables.TabularDataModule` feeds the net.

They read the train, validation and test tensors exactly as the net sees them (after imputation, scaling
and one-hot encoding) and name columns by :attr:`Preprocessor.feature_names`.
"""

import numpy as np
import torch
from sklearn.metrics import balanced_accuracy_score, r2_score
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

from src.apps.doctor.findings import Finding
from src.data.loading import Stage
from src.errors import notice
from src.extras.tables import TabularDataModule

SPLITS: tuple[Stage, ...] = ("train", "val", "test")
#: share of validation or test rows that may repeat a training row before it counts as leakage
DUPLICATE_SHARE = 0.01
#: a single feature scoring this well on the validation rows (balanced accuracy, or R²) gives the answer away
DETERMINES = 0.98
#: training rows a one-feature tree is fitted on at most (a sample of bigger splits)
TREE_ROWS = 20_000
#: largest class count over smallest that counts as heavy imbalance
IMBALANCE = 10.0
#: one array per split, by name
Splits = dict[str, np.ndarray]


def check_data(data: TabularDataModule, weighs_classes: bool) -> list[Finding]:
    """All data checks; ``weighs_classes`` says whether the task's loss weighs classes already."""
    tensors = {stage: data.dataset(stage).tensors for stage in SPLITS}
    x: Splits = {stage: t[0].numpy() for stage, t in tensors.items()}
    y: Splits = {stage: t[1].numpy() for stage, t in tensors.items()}
    names = data.preprocessor.feature_names
    classification = not torch.is_floating_point(tensors["train"][1])
    findings = [non_finite(x, y, names), constant_in_training(x, names), duplicates_across_splits(x)]
    if y["train"].ndim == 1:  # one target per row: a class id or a value
        findings.append(feature_determines_target(x, y, names, classification))
        findings.append(class_imbalance(y["train"], weighs_classes) if classification else None)
    else:
        notice(
            f"doctor: the checks of one target per row (a feature that alone predicts it, class imbalance) "
            f"do not apply to {y['train'].shape[1]} targets per row; the other data checks ran."
        )
    return [f for f in findings if f is not None]


def _columns(names: list[str], mask: np.ndarray, most: int = 5) -> str:
    picked = [names[i] for i in np.flatnonzero(mask)]
    more = f" and {len(picked) - most} more" if len(picked) > most else ""
    return ", ".join(repr(n) for n in picked[:most]) + more


def non_finite(x: Splits, y: Splits, names: list[str]) -> Finding | None:
    parts = []
    for stage in SPLITS:
        bad = ~np.isfinite(x[stage])
        if bad.any():
            parts.append(f"{int(bad.sum())} in the {stage} features ({_columns(names, np.any(bad, axis=0))})")
        bad_y = ~np.isfinite(y[stage].astype(np.float64))
        if bad_y.any():
            parts.append(f"{int(bad_y.sum())} in the {stage} targets")
    if not parts:
        return None
    return Finding(
        "data-non-finite",
        "NaN or infinite values: " + "; ".join(parts),
        "one NaN in a batch makes its loss NaN, and the step then writes NaN into every weight it updates",
        "fill or drop them before training (empty cells are filled by data.encoding.impute_strategy; a "
        "value such as "
        "'inf' or 1e400 in the file is not empty and passes through)",
    )


def constant_in_training(x: Splits, names: list[str]) -> Finding | None:
    """A feature constant over the training rows that varies in validation or test.

    A feature constant everywhere is zero after scaling (or a second bias) and harmless, so it is not
    reported: the harm is a weight that never learns and then meets values.
    """
    low, high = x["train"].min(axis=0), x["train"].max(axis=0)
    constant = low == high
    varies = np.zeros_like(constant)
    rows = 0
    for stage in ("val", "test"):
        differs = x[stage] != low
        varies |= differs.any(axis=0)
        rows += int((differs & constant).any(axis=1).sum())
    flagged = constant & varies
    if not flagged.any():
        return None
    return Finding(
        "data-constant-feature",
        f"{_columns(names, flagged)} constant over all {len(x['train'])} training rows but not over "
        f"{rows} validation/test rows",
        "a weight never sees its input vary in training, so it learns nothing about it (it stays at its "
        "random start), then multiplies the values validation, test and new rows bring",
        "drop the column (data.columns.drop), or fix the split or source so that training rows show it vary",
    )


def duplicates_across_splits(x: Splits) -> Finding | None:
    seen = {row.tobytes() for row in x["train"]}
    parts = []
    for stage in ("val", "test"):
        repeated = sum(row.tobytes() in seen for row in x[stage])
        if repeated > DUPLICATE_SHARE * len(x[stage]):
            parts.append(f"{repeated} of {len(x[stage])} {stage} rows ({repeated / len(x[stage]):.0%})")
    if not parts:
        return None
    return Finding(
        "data-duplicates-across-splits",
        " and ".join(parts) + " repeat a training row feature for feature",
        "the model is scored on rows it trained on, so validation and test overstate how it does on new rows "
        "(leakage)",
        "drop duplicate rows before the split (pandas drop_duplicates), or split by what the rows repeat "
        "(a patient, a user, a session)",
    )


def feature_determines_target(x: Splits, y: Splits, names: list[str], classification: bool) -> Finding | None:
    """A single feature that predicts the validation targets almost perfectly (a one-feature tree)."""
    rows = np.random.default_rng(0).permutation(len(x["train"]))[:TREE_ROWS]
    best, column = 0.0, -1
    for j in range(x["train"].shape[1]):
        train, val = x["train"][rows, j : j + 1], x["val"][:, j : j + 1]
        if classification:
            classes = len(np.unique(y["train"]))
            tree = DecisionTreeClassifier(max_leaf_nodes=max(2 * classes, 8), random_state=0)
            score = balanced_accuracy_score(y["val"], tree.fit(train, y["train"][rows]).predict(val))
        else:
            tree = DecisionTreeRegressor(max_leaf_nodes=64, random_state=0)
            score = r2_score(y["val"], tree.fit(train, y["train"][rows]).predict(val))
        if score > best:
            best, column = score, j
    if best < DETERMINES:
        return None
    measure = "balanced accuracy" if classification else "R²"
    return Finding(
        "data-feature-determines-target",
        f"{names[column]!r} alone predicts the validation targets with {measure} {best:.3f} (a one-feature "
        "decision tree fitted on the training rows)",
        "a column this close to the answer is usually the answer itself, recorded after the fact or derived "
        "from it; the model leans on it and fails on new rows, where it is missing or means something else",
        f"drop {names[column]!r} (data.columns.drop) unless it is truly known when predicting",
    )


def class_imbalance(y_train: np.ndarray, weighs_classes: bool) -> Finding | None:
    counts = np.bincount(y_train[y_train >= 0])
    present = counts[counts > 0]
    ratio = present.max() / present.min()
    if ratio < IMBALANCE or weighs_classes:
        return None
    smallest = int(np.flatnonzero(counts == present.min())[0])
    return Finding(
        "data-class-imbalance",
        f"the largest class has {ratio:.0f}x the training rows of the smallest (class "
        f"{int(counts.argmax())}: {present.max()} rows, class {smallest}: {present.min()})",
        "unweighted cross-entropy is lowest when the model favours the big class; accuracy looks fine while "
        "the small class is mostly missed",
        "set model.init_args.class_weights: true (balanced weights from the training split) and watch the "
        "macro f1 rather than acc",
    )


def labels_out_of_range(labels: torch.Tensor, outputs: int) -> Finding | None:
    """Class labels outside ``[0, outputs)`` for a net with ``outputs`` logits per row."""
    low, high = int(labels.min()), int(labels.max())
    if low >= 0 and high < outputs:
        return None
    return Finding(
        "data-label-out-of-range",
        f"the training labels run from {low} to {high}, but the net has {outputs} outputs (classes 0 to "
        f"{outputs - 1})",
        "cross-entropy needs labels in [0, C): on a CPU it stops with an index error, on a GPU with a "
        "device-side assert far from the cause; labels shifted by one that still fit train the wrong classes",
        "encode the labels as 0..C-1 (the DataModule's preprocessing does) and take the class count from the "
        "data (the CLI links data.out_features into the model)",
    )
