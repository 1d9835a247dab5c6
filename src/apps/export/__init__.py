"""Ship a checkpoint to another runtime: an ONNX or ``torch.export`` graph, and a JSON sidecar beside it.

    python -m src.apps.export --ckpt_path CKPT --format onnx --output model.onnx     # make export CKPT=...
    python -m src.apps.export --ckpt_path CKPT --format torch-export --output model.pt2

Two files are written: the graph at ``--output`` (left out: beside the checkpoint, ``.onnx`` or
``.pt2``) and the sidecar at ``<output>.json``. Both are first written under temporary names in the
destination folder and renamed only after the check below passed, so a failed export leaves nothing;
neither may be the checkpoint, and an existing file is replaced only with ``--overwrite``.

**An image checkpoint** (a run of :class:`src.extras.images.ImageDataModule`) gives a graph that takes
``images``, uint8 pixels ``(B, H, W, C)`` as decoded files stack (B dynamic), and holds the float
conversion, the standardization with the run's statistics and the net; it returns ``logits`` ``(B, K)``.
Its sidecar's ``graph`` says the ``layout``, ``dtype``, ``mode``, ``size``; its ``preprocessing`` the
``labels``, ``resize``, ``mean`` and ``std`` (already inside the graph); its ``recipe``
(:data:`IMAGE_RECIPE`) how a file becomes a row of the input. What follows is the table case.

**An ONNX table graph takes the raw columns**: one input per column of the training file, ``(B,)``
each (B dynamic): ``double`` for a numeric column (``NaN`` for a missing cell), ``string`` for a
categorical one (``""`` for a missing cell). The cell rule of :mod:`src.extras.tables.preprocessing` (missing
texts, stray text in a number, unseen categories to ``(other)``), the imputation, scaling, missing
indicators and one-hot blocks are inside the graph, then the net; it returns

- classification: ``logits`` ``(B, K)``, ``probabilities`` ``(B, K)`` (the softmax ``predict``
  reports) and ``label`` ``(B,)``, ``preprocessing.labels[argmax]``;
- regression, and any model whose ``predict_step`` gives other than one class of K: ``values``, its
  ``preds``, ``(B,)`` in the target's units or ``(B, K)`` (K outputs, or K labels' 0/1 choices); its
  other outputs stay out of the graph, which a line says.

So onnxruntime in any language predicts from raw rows with no code of ours (this folder's README.md has
the example; ``test_export.py`` beside this file and ``src/extras/tables/test_cells.py`` hold it equal to
:class:`src.predict.Predictor`).
**A torch.export program** takes ``features``, the encoded float32 matrix ``(B, F)`` that
:meth:`src.predict.Predictor.encode` makes (F = ``len(feature_names)``), and returns ``logits`` or
``values``; it loads with ``torch.export.load(path).module()`` and needs neither this project nor
Lightning.

**The sidecar** (``format_version`` :data:`SIDECAR_VERSION`) says what a graph cannot:

- ``graph``: ``file``, ``format``; for ONNX ``inputs`` (each column's ``name`` and ``dtype``, in order)
  and ``outputs``; for torch.export ``input`` (``"features"``), ``output``, ``in_features`` (F);
- ``csv`` (ONNX): ``missing``, the texts a CSV reader should read as missing cells;
- ``feature_names``: one name per column of the encoded matrix, in order;
- ``missing_category``: the category a missing categorical cell becomes;
- ``preprocessing``: :meth:`Preprocessor.state_dict` as saved: ``task``, ``target``, ``labels``,
  ``numeric`` (``name``, ``fill``, ``mean``, ``scale``, ``indicator``, ``missing_tokens``),
  ``categorical`` (``name``, ``categories``, ``other``), ``version``;
- ``recipe``: the rules below, as sentences.

The rules, as sentences, are :data:`RAW_RECIPE` (ONNX) and :data:`RECIPE` (torch.export);
:mod:`src.extras.tables.preprocessing` applies them, and ``src/apps/export/test_export.py``
re-implements them from the sidecar alone and holds the two equal.
"""

import argparse
import functools
import io
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
import onnx
import pandas as pd
import torch
from torch import nn

from src.data.arrays import ArrayReading
from src.errors import UserInputError, notice
from src.extras.tables.predict import TableReading, table_preprocessor
from src.extras.tables.preprocessing import (
    FLOAT32_MAX,
    MISSING,
    CategoricalColumn,
    CellReport,
    Preprocessor,
    cell_text,
    numbers_as_written,
)
from src.files import check_output, written

if TYPE_CHECKING:
    from lightning import LightningModule
from src.predict import Predictor

Format = Literal["onnx", "torch-export"]
FORMATS: tuple[str, ...] = get_args(Format)
SUFFIXES: dict[str, str] = {"onnx": ".onnx", "torch-export": ".pt2"}
SIDECAR_VERSION = 2  # 2: an ONNX table graph takes the raw columns

#: how raw cells become the input matrix; written into every sidecar and appended to this docstring
RECIPE = (
    "The input row holds, in this order: one value per numeric column, one 0/1 value per numeric column "
    "whose indicator is true, then one block per categorical column; feature_names names each value.",
    "Numeric column: a number, or a text that reads as one, is its value; null, an empty or blank text, "
    "or a text listed in missing_tokens is missing and takes fill; the value written is "
    "(value - mean) / scale, computed in float64 and stored as float32.",
    "Missing indicator: 1 if that numeric cell was missing, else 0.",
    "Categorical column: the cell as text, with surrounding spaces removed, a whole number without a "
    "decimal part (3.0 is '3'), booleans as 'True' and 'False'; null or blank is missing_category. Then one "
    "value per entry of categories, 1 where the text equals it, and, if other is true, one last value "
    "that is 1 when none matched.",
    "Output: classification: logits (B, K), softmax over the last axis gives the probabilities and "
    "class k is labels[k]; otherwise values, the model's predict_step preds: (B,) in the target's units, "
    "or (B, K).",
)
#: how an image file becomes one row of the image graph's input; written into every image sidecar
IMAGE_RECIPE = (
    "Decode the file and convert it to the sidecar's mode (Pillow's Image.convert: L is grayscale, one "
    "channel; RGB three).",
    "If its size differs from size (height, width): resize it to that size with bilinear resampling "
    "(Pillow's Image.resize with Resampling.BILINEAR) when resize is true; otherwise the model cannot "
    "take it.",
    "Its pixels as uint8 (height, width, channels) are one row of the input images (B, H, W, C); the graph "
    "divides by 255 and standardizes each channel with mean and std itself.",
    "Output: logits (B, K); softmax over the last axis gives the probabilities and class k is labels[k].",
)
__doc__ = (__doc__ or "") + "".join(f"\n{i}. {rule}" for i, rule in enumerate(RECIPE, 1)) + "\n"


@dataclass(frozen=True)
class Tolerance:
    """How far the exported graph may be from the checkpoint's model: ``|a - b| <= atol + rtol * |b|``."""

    rtol: float
    atol: float


#: onnxruntime has its own kernels (different summation order); torch.export runs torch's own
TOLERANCES: dict[str, Tolerance] = {
    "onnx": Tolerance(rtol=1e-5, atol=1e-5),
    "torch-export": Tolerance(rtol=1e-6, atol=1e-6),
}


class ExportCheckError(RuntimeError):
    """The exported graph does not compute what the checkpoint computes: nothing was written."""


class Exportable(nn.Module):
    """The part of a task a graph can hold: ``(B, F)`` encoded rows → logits ``(B, K)``, or values ``(B,)``
    or ``(B, K)``.

    Classification (one class of K) keeps the logits (the model's ``forward``); anything else goes through
    ``predict_step``, whose ``preds`` are the values (a regression's back in the target's units).
    """

    def __init__(self, model: "LightningModule", classification: bool) -> None:
        super().__init__()
        self.model = model
        self.classification = classification

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.classification:
            return self.model(features)  # (B, K) raw logits
        return self.model.predict_step((features,), 0)["preds"]  # (B,) in the target's units


def image_sidecar_of(preprocessing: Any, graph_file: str, fmt: str) -> dict[str, Any]:
    """An image checkpoint's sidecar: how to call the graph, and what the run fitted and how it read files
    (``preprocessing``: the predictor's reading of images, with its ``size``, ``mode``, ``channels`` and
    ``state()``)."""
    height, width = preprocessing.size
    return {
        "format_version": SIDECAR_VERSION,
        "graph": {
            "file": graph_file,
            "format": fmt,
            "input": "images",
            "output": "logits",
            "layout": "BHWC",
            "dtype": "uint8",
            "mode": preprocessing.mode,
            "size": [height, width],
            "shape": ["B", height, width, preprocessing.channels],
        },
        "preprocessing": {"task": "classification", **preprocessing.state()},
        "recipe": list(IMAGE_RECIPE),
    }


def probe_images(preprocessing: Any, images: int = 8, seed: int = 0) -> torch.Tensor:
    """uint8 ``(B, H, W, C)`` pixels drawn at random over 0…255: every input value the graph can see."""
    shape = (images, *preprocessing.size, preprocessing.channels)
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8))


def sidecar_of(
    preprocessor: Preprocessor, graph_file: str, fmt: str, in_features: int, classification: bool
) -> dict[str, Any]:
    """The sidecar's content: the checkpoint's preprocessing as it is saved, plus how to call the graph:
    an ONNX graph takes the raw columns (:data:`RAW_RECIPE`), a torch.export program the encoded matrix
    (:data:`RECIPE`); ``classification``: the graph ends in one class of K (else in ``values``)."""
    sidecar: dict[str, Any] = {"format_version": SIDECAR_VERSION}
    if fmt == "onnx":
        outputs = ["logits", "probabilities", "label"] if classification else ["values"]
        numeric = [{"name": c.name, "dtype": "double"} for c in preprocessor.numeric]
        sidecar["graph"] = {
            "file": graph_file,
            "format": fmt,
            "inputs": numeric + [{"name": c.name, "dtype": "string"} for c in preprocessor.categorical],
            "outputs": outputs,
        }
        # pandas names its default missing texts only in a private module (its read_csv docs list them)
        from pandas._libs.parsers import STR_NA_VALUES

        sidecar["csv"] = {"missing": sorted({*STR_NA_VALUES, *preprocessor.na_values})}
        recipe: tuple[str, ...] = RAW_RECIPE
    else:
        sidecar["graph"] = {
            "file": graph_file,
            "format": fmt,
            "input": "features",
            "output": "logits" if classification else "values",
            "in_features": in_features,
        }
        recipe = RECIPE
    return {
        **sidecar,
        "feature_names": preprocessor.feature_names,
        "missing_category": MISSING,
        "preprocessing": preprocessor.state_dict(),
        "recipe": list(recipe),
    }


def probe_rows(preprocessor: Preprocessor, rows: int = 16, seed: int = 0) -> pd.DataFrame:
    """Raw rows that reach every part of the encoding and of the one cell rule: numbers around each
    column's training mean (some written as text), every kind of missing cell (None, NaN, blank text, a
    missing token), text that is not a number, numbers beyond float32, every category (some with spaces
    around), and a value no training row had."""
    rng = np.random.default_rng(seed)
    tokens = preprocessor.na_values[:1]
    columns: dict[str, list[Any]] = {}
    for numeric in preprocessor.numeric:
        values: list[Any] = list(numeric.mean + numeric.scale * rng.standard_normal(rows))
        special = [None, np.nan, "", "  ", "not a number", 1e39, -np.inf, f" {values[7]!r} "]
        special += [*numeric.missing_tokens[:1], *tokens]
        values[: len(special)] = special
        columns[numeric.name] = values
    for categorical in preprocessor.categorical:
        spaced = [f" {c} " for c in categorical.categories[:1]]
        choices = [
            None,
            np.nan,
            "",
            "(a value no training row had)",
            *spaced,
            *tokens,
            *categorical.categories,
        ]
        columns[categorical.name] = [choices[i % len(choices)] for i in range(rows)]
    return pd.DataFrame(columns, index=range(rows))


def run_exported(fmt: str, path: Path, x: torch.Tensor) -> torch.Tensor:
    """Run a written graph the way its users will: onnxruntime, or ``torch.export.load``."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (graph_input,) = session.get_inputs()  # "features" for a table, "images" for images
        return torch.from_numpy(session.run(None, {graph_input.name: x.numpy()})[0])
    with torch.inference_mode():
        return torch.export.load(path).module()(x)


def check_raw(path: Path, predictor: Predictor, rows: pd.DataFrame) -> float:
    """The largest difference between the raw-column graph on ``rows`` (and on its first row alone) and
    :meth:`Predictor.predict` on the same rows: probabilities (or values) within the ONNX tolerance, and
    the same labels; raises :class:`ExportCheckError` otherwise."""
    import onnxruntime

    tolerance = TOLERANCES["onnx"]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    preprocessor = table_preprocessor(predictor.reading)
    worst = 0.0
    for frame in (rows, rows.iloc[:1]):
        expected = predictor.predict(frame, "the probe rows", CellReport())  # counted, not logged
        got = dict(
            zip(
                [o.name for o in session.get_outputs()],
                session.run(None, graph_inputs(preprocessor, frame)),
                strict=True,
            )
        )
        if "values" in got:  # predict_step's preds, as the checkpoint gives them for the same rows
            encoded = predictor.read(frame, ["the probe rows"], CellReport())
            pairs = [(got["values"], predictor.outputs(encoded)["preds"].numpy())]
        else:
            names = [f"probability({label})" for label in preprocessor.labels or []]
            pairs = [(got["probabilities"], expected[names].to_numpy(np.float32))]
            if got["label"].tolist() != expected["prediction"].tolist():
                raise ExportCheckError(
                    f"the exported onnx graph labels {len(frame)} raw row(s) otherwise than the checkpoint; "
                    "nothing was written."
                )
        for graph_values, reference in pairs:
            difference = np.abs(graph_values - reference)
            largest = float(difference.max(initial=0.0))
            worst = max(worst, largest)
            if (
                graph_values.shape != reference.shape
                or (difference > tolerance.atol + tolerance.rtol * np.abs(reference)).any()
            ):
                raise ExportCheckError(
                    f"the exported onnx graph differs from the checkpoint by up to {largest:.3g} on "
                    f"{len(frame)} raw row(s), beyond rtol={tolerance.rtol}, atol={tolerance.atol}; nothing "
                    "was written."
                )
    return worst


def check(fmt: str, path: Path, reference: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    """The largest difference between the written graph and the checkpoint's model on ``x``, and on its
    first row alone (the batch dimension is dynamic); raises :class:`ExportCheckError` past tolerance."""
    tolerance = TOLERANCES[fmt]
    worst = 0.0
    for rows in (x, x[:1]):
        with torch.inference_mode():
            expected = reference(rows)
        got = run_exported(fmt, path, rows)
        if got.shape != expected.shape:
            raise ExportCheckError(
                f"the exported {fmt} graph returned shape {tuple(got.shape)} for {len(rows)} row(s), the "
                f"checkpoint {tuple(expected.shape)}; nothing was written."
            )
        difference = (got - expected).abs()
        largest = float(difference.max())
        worst = max(worst, largest)
        if (difference > tolerance.atol + tolerance.rtol * expected.abs()).any():
            raise ExportCheckError(
                f"the exported {fmt} graph differs from the checkpoint by up to {largest:.3g} on "
                f"{len(rows)} row(s), beyond rtol={tolerance.rtol}, atol={tolerance.atol}; nothing was "
                "written."
            )
    return worst


# -- the raw-column ONNX graph ------------------------------------------------------------------------

#: the default domain's opset of a raw-column graph: RegexFullMatch, which compares texts with the spaces
#: around them ignored, exists from 20 on
RAW_OPSET = 20
#: any run of the characters Python's str.strip() removes, as an RE2 pattern (code points spelled out)
SPACES = (
    "[" + "".join(f"\\x{{{ord(c):x}}}" for c in map(chr, range(sys.maxunicode + 1)) if c.isspace()) + "]*"
)
#: how the cells of a table become the raw graph's inputs; written into every ONNX sidecar of a table
RAW_RECIPE = (
    "One input per column of graph.inputs, each of shape (B,): a numeric column (dtype double) takes the "
    "cell's number, and NaN for a missing cell (null, NaN, an empty text) and for any text that is not a "
    "number; a categorical column (dtype string) takes the cell's text: '' for a missing cell, booleans "
    "as 'True' and 'False', a whole number without its decimal part (3.0 is '3'), other numbers as Python "
    "writes them, text as it is.",
    "Inside the graph, as src.extras.tables.preprocessing applies it: a number that is NaN, infinite or "
    "beyond float32's range (itself or once standardized) is missing and takes fill; a text that is blank "
    "or, spaces around it ignored, one of na_values is missing_category; a text matching none of categories "
    "sets the (other) value when other is true, and no value otherwise.",
    "A CSV file is read as pandas.read_csv reads it: the texts of csv.missing are missing cells.",
    "Outputs: classification: logits (B, K), probabilities (B, K) and label (B,), labels[argmax]; "
    "otherwise values, the model's predict_step preds: (B,) in the target's units, or (B, K).",
)


class _Nodes:
    """ONNX nodes and constants with names of their own: what one raw-column graph's preprocessing holds."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[onnx.TensorProto] = []

    def const(self, value: Any, dtype: Any) -> str:
        name = f"prep/const{len(self.constants)}"
        array = np.asarray(value, dtype=dtype)
        self.constants.append(onnx.numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, *inputs: str, output: str | None = None, **attributes: Any) -> str:
        name = output or f"prep/{op_type}{len(self.nodes)}"
        self.nodes.append(onnx.helper.make_node(op_type, list(inputs), [name], **attributes))
        return name

    def column(self, x: str) -> str:
        """``(B,)`` → ``(B, 1)`` float32."""
        return self.op("Unsqueeze", self.op("Cast", x, to=onnx.TensorProto.FLOAT), self.const([1], np.int64))


def _spaced(texts: Sequence[str]) -> str:
    """An RE2 pattern matching any of ``texts`` with spaces around it: code points spelled out, so that no
    character of a category can mean anything else."""
    literal = ["".join(f"\\x{{{ord(c):x}}}" for c in text) for text in texts]
    return f"{SPACES}(?:{'|'.join(literal)}){SPACES}"


def _target_encoded(categorical: CategoricalColumn, hits: list[str], nodes: _Nodes) -> str:
    """``(B, width)`` float32 target encodings of one column from its categories' ``(B,)`` matches: the
    matched category's row of the table, or ``default`` where none matched (as :meth:`Preprocessor.encode`
    looks them up, in float64 and rounded once)."""
    double, one = onnx.TensorProto.DOUBLE, nodes.const([1], np.int64)
    matched = nodes.op(
        "Concat", *[nodes.op("Unsqueeze", nodes.op("Cast", hit, to=double), one) for hit in hits], axis=1
    )  # (B, C), a 1 where a category matched
    table = nodes.const(np.asarray(categorical.encodings, np.float64).reshape(len(hits), -1), np.float64)
    unmatched = nodes.op("Sub", nodes.const(1.0, np.float64), nodes.op("ReduceSum", matched, one, keepdims=1))
    default = nodes.const(np.asarray(categorical.default, np.float64)[None, :], np.float64)  # (1, width)
    encoded = nodes.op("Add", nodes.op("MatMul", matched, table), nodes.op("Mul", unmatched, default))
    return nodes.op("Cast", encoded, to=onnx.TensorProto.FLOAT)


def raw_preprocessing(preprocessor: Preprocessor, nodes: _Nodes, output: str) -> list[onnx.ValueInfoProto]:
    """The graph's inputs, one per raw column, and the nodes that make ``output``, the ``(B, F)`` float32
    matrix :meth:`Preprocessor.transform` makes, in the order of its ``feature_names``."""
    double, f32max = np.float64, FLOAT32_MAX
    values, indicators, blocks = [], [], []
    for column in preprocessor.numeric:
        x = column.name  # (B,) float64, NaN where missing or not a number
        far = nodes.op("Greater", nodes.op("Abs", x), nodes.const(f32max, double))  # inf too
        missing = nodes.op("Or", nodes.op("IsNaN", x), far)
        filled = nodes.op("Where", missing, nodes.const(column.fill, double), x)
        scaled = nodes.op(
            "Div",
            nodes.op("Sub", filled, nodes.const(column.mean, double)),
            nodes.const(column.scale, double),
        )
        beyond = nodes.op("Greater", nodes.op("Abs", scaled), nodes.const(f32max, double))
        at_fill = nodes.const((column.fill - column.mean) / column.scale, double)  # as numpy computes it
        values.append(nodes.column(nodes.op("Where", beyond, at_fill, scaled)))
        if column.indicator:
            indicators.append(nodes.column(nodes.op("Or", missing, beyond)))
    tokens = [t for t in preprocessor.na_values if t == t.strip()]  # others never equal a stripped text
    for categorical in preprocessor.categorical:
        text = categorical.name  # (B,) string
        missing = nodes.op("RegexFullMatch", text, pattern=_spaced(["", *tokens]))
        hits = []
        for category in categorical.categories:
            hit = nodes.op("RegexFullMatch", text, pattern=_spaced([category]))
            hits.append(nodes.op("Or", hit, missing) if category == MISSING else hit)
        if categorical.encodings is not None:
            blocks.append(_target_encoded(categorical, hits, nodes))
            continue
        if categorical.other:  # 1 where no category matched (every row, for a column of rare values only)
            never = [] if hits else [nodes.op("And", missing, nodes.op("Not", missing))]
            hits.append(nodes.op("Not", functools.reduce(lambda a, b: nodes.op("Or", a, b), hits + never)))
        blocks += [nodes.column(hit) for hit in hits]
    nodes.op("Concat", *values, *indicators, *blocks, output=output, axis=1)
    return [
        onnx.helper.make_tensor_value_info(c.name, onnx.TensorProto.DOUBLE, ["batch"])
        for c in preprocessor.numeric
    ] + [
        onnx.helper.make_tensor_value_info(c.name, onnx.TensorProto.STRING, ["batch"])
        for c in preprocessor.categorical
    ]


def raw_graph(net: onnx.ModelProto, preprocessor: Preprocessor, classification: bool) -> onnx.ModelProto:
    """The exported net (``features`` ``(B, F)`` in) behind its preprocessing: raw columns in; for
    classification (one class of K) ``logits``, ``probabilities`` and ``label`` (the class's label, by a
    Gather on the labels) out, else ``values``. One graph, one file."""
    nodes = _Nodes()
    inputs = raw_preprocessing(preprocessor, nodes, "features")
    graph = net.graph
    taken = {n for node in graph.node for n in (*node.input, *node.output)} | {
        i.name for i in graph.initializer
    }
    clashing = [c for c in preprocessor.columns if c in taken | {"probabilities", "label"}]
    if clashing:
        raise UserInputError(
            f"the column(s) {clashing} share a name with a part of the exported net; rename them in the "
            "training file, or export with --format torch-export."
        )
    before = len(nodes.nodes)  # the preprocessing's nodes; those after the net follow
    outputs = list(graph.output)
    if classification and preprocessor.labels is not None:
        labels = preprocessor.labels
        numbered = all(isinstance(label, int) for label in labels)
        probabilities = nodes.op("Softmax", "logits", output="probabilities", axis=-1)
        index = nodes.op("ArgMax", probabilities, axis=1, keepdims=0)  # (B,) int64, the first of ties
        nodes.op(
            "Gather", nodes.const(labels, np.int64 if numbered else object), index, output="label", axis=0
        )
        outputs += [
            onnx.helper.make_tensor_value_info(
                "probabilities", onnx.TensorProto.FLOAT, ["batch", len(labels)]
            ),
            onnx.helper.make_tensor_value_info(
                "label", onnx.TensorProto.INT64 if numbered else onnx.TensorProto.STRING, ["batch"]
            ),
        ]
    merged = onnx.helper.make_graph(
        [*nodes.nodes[:before], *graph.node, *nodes.nodes[before:]],
        "raw_columns",
        inputs,
        outputs,
        [*nodes.constants, *graph.initializer],
        value_info=list(graph.value_info),
    )
    opsets = [o for o in net.opset_import if o.domain not in ("", "ai.onnx")]
    default = max([o.version for o in net.opset_import if o.domain in ("", "ai.onnx")] + [RAW_OPSET])
    model = onnx.helper.make_model(
        merged,
        opset_imports=[onnx.helper.make_opsetid("", default), *opsets],
        ir_version=net.ir_version,
        functions=list(net.functions),
    )
    onnx.checker.check_model(model)
    return model


def graph_inputs(preprocessor: Preprocessor, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Raw rows as the raw graph's inputs, by :data:`RAW_RECIPE`'s first rule (column names without
    surrounding spaces, as :meth:`Preprocessor.transform` reads them)."""
    frame = frame.rename(columns=lambda name: name.strip() if isinstance(name, str) else name)
    inputs = {c.name: numbers_as_written(frame[c.name]) for c in preprocessor.numeric}
    for column in preprocessor.categorical:
        inputs[column.name] = np.array([cell_text(v) for v in frame[column.name]], dtype=object)
    return inputs


@dataclass(frozen=True)
class Prepared:
    """What one checkpoint exports: the module the graph holds (also the reference of the check), an
    example input, the graph's input and output names, and its sidecar given ``(graph file, format)``."""

    module: nn.Module
    example: torch.Tensor
    input: str
    output: str
    sidecar: Callable[[str, str], dict[str, Any]]
    #: a table's ONNX graph: the exported net behind the preprocessing, and the check of raw rows
    raw: Callable[[onnx.ModelProto], onnx.ModelProto] | None = None
    check_raw: Callable[[Path], float] | None = None
    #: what the graph is checked against, where not ``module`` itself: the checkpoint's own answers
    reference: Callable[[torch.Tensor], torch.Tensor] | None = None


def one_class_of_k(outputs: dict[str, torch.Tensor]) -> bool:
    """Whether ``predict_step``'s outputs are those of one class of K: ``probs`` ``(N, K)``, with ``preds``
    ``(N,)`` class ids or none (the shipped classifier's), which a graph's softmax and argmax give."""
    probs, preds = outputs.get("probs"), outputs.get("preds")
    return probs is not None and probs.ndim == 2 and (preds is None or preds.ndim == 1)


def table_export(ckpt_path: str | Path) -> Prepared:
    """A table checkpoint: encoded rows ``(B, F)`` in, its preprocessing in the sidecar. What the graph
    returns follows the model's ``predict_step`` on the probe rows: logits for one class of K (a table of
    class labels), else its ``preds`` as ``values``."""
    predictor = Predictor.from_checkpoint(ckpt_path)  # one sentence for a missing or unsafe file
    preprocessor = table_preprocessor(predictor.reading)
    rows = probe_rows(preprocessor)
    x = predictor.read(rows, ["the probe rows"], CellReport())  # (16, F); its notices are no news
    outputs = predictor.outputs(x)
    classification = preprocessor.labels is not None and one_class_of_k(outputs)
    model = type(predictor.model).__name__
    if not classification and "preds" not in outputs:
        raise UserInputError(
            f"the exported graph returns predict_step's preds, but {model}.predict_step returns only "
            f"{sorted(outputs)}; return the predictions as preds."
        )
    left_out = [] if classification else sorted(set(outputs) - {"preds"})
    if left_out:
        notice(
            f"export: the graph returns {model}.predict_step's preds as values; {left_out} stay out of it."
        )
    module = Exportable(predictor.model, classification=classification).eval()
    return Prepared(
        module,
        x,
        "features",
        "logits" if classification else "values",
        lambda file, fmt: sidecar_of(preprocessor, file, fmt, x.shape[1], classification),
        raw=lambda net: raw_graph(net, preprocessor, classification),
        check_raw=lambda path: check_raw(path, predictor, rows),
    )


def array_export(ckpt_path: str | Path) -> Prepared:
    """An array checkpoint (:class:`src.data.ArrayDataModule`): raw float32 features ``(B, F)`` in, the
    training rows' standardization and the net inside the graph; logits for one class of K, else values."""
    predictor = Predictor.from_checkpoint(ckpt_path, device="cpu")
    reading = predictor.reading
    assert isinstance(reading, ArrayReading)  # export chose this path by it
    columns, labels = list(reading.columns), reading.labels
    classification = labels is not None
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(16, len(columns))).astype(np.float32))
    output = "logits" if classification else "values"

    def sidecar(file: str, fmt: str) -> dict[str, Any]:
        graph = {"file": file, "format": fmt, "input": "features", "output": output, "dtype": "float32"}
        return {"format_version": SIDECAR_VERSION, "graph": graph, "feature_names": columns, "labels": labels}

    def answers(rows: torch.Tensor) -> torch.Tensor:  # the checkpoint's: logits, or predict_step's preds
        return predictor.graph(rows) if classification else predictor.outputs(rows)["preds"]

    module = reading.graph(Exportable(predictor.model, classification)).eval()
    return Prepared(module, x, "features", output, sidecar, reference=answers)


def image_export(ckpt_path: str | Path) -> Prepared:
    """An image checkpoint: uint8 pixels ``(B, H, W, C)`` in, normalization and net inside the graph."""
    predictor = Predictor.from_checkpoint(ckpt_path, device="cpu")
    preprocessing = predictor.reading  # an image run's (src.extras.images.predict.ImagePreprocessing)
    return Prepared(
        predictor.graph,
        probe_images(preprocessing),  # (8, H, W, C)
        "images",
        "logits",
        lambda file, fmt: image_sidecar_of(preprocessing, file, fmt),
    )


def export(
    ckpt_path: str | Path, fmt: str, output: str | Path | None = None, overwrite: bool = False
) -> tuple[Path, Path, float]:
    """Write the graph and its sidecar, checked against the checkpoint.

    Neither file may be the checkpoint, nor replace an existing file unless ``overwrite``
    (:func:`src.files.check_output`). Returns ``(graph path, sidecar path, largest difference seen in the
    check)``.
    """
    if fmt not in FORMATS:
        raise UserInputError(f"--format {fmt!r} is unknown; choose one of {', '.join(FORMATS)}.")
    # one sentence for a missing or unsafe file
    reading = Predictor.from_checkpoint(ckpt_path, device="cpu").reading
    kind = table_export if isinstance(reading, TableReading) else image_export
    prepared = (array_export if isinstance(reading, ArrayReading) else kind)(ckpt_path)
    option = "--output" if output is not None else "the default output beside the checkpoint"
    graph_path = Path(output) if output is not None else Path(ckpt_path).with_suffix(SUFFIXES[fmt])
    check_output(output if output is not None else graph_path, [ckpt_path], overwrite, option)
    sidecar_path = graph_path.with_name(graph_path.name + ".json")
    check_output(sidecar_path, [ckpt_path], overwrite, f"the sidecar of {option}")

    module, x = prepared.module, prepared.example
    # B is dynamic; an example of 8 rows keeps torch.export from specializing it to 1
    dynamic = {prepared.input: {0: torch.export.Dim("batch", min=1)}}
    program = torch.export.export(module, (x,), dynamic_shapes=dynamic)
    sidecar = prepared.sidecar(graph_path.name, fmt)
    try:
        with written(graph_path, sidecar_path) as (graph_temp, sidecar_temp):
            if fmt == "onnx":
                # its registry warns that torchvision's operators are absent; no net here uses them
                logging.getLogger("torch.onnx").setLevel(logging.ERROR)
                onnx_program = torch.onnx.export(
                    program,
                    (x,),
                    input_names=[prepared.input],
                    output_names=[prepared.output],
                    dynamic_shapes=dynamic,
                    external_data=False,  # one self-contained file: the shipped nets are far below 2 GB
                    verbose=False,
                )
                assert onnx_program is not None  # the dynamo exporter always returns its program
                if prepared.raw is None:
                    onnx_program.save(graph_temp)
                else:
                    onnx.save(prepared.raw(onnx_program.model_proto), graph_temp)
            else:
                # into memory, then written by Python: torch's writer aborts the whole process when a
                # write to a file fails (a full disk), where Python raises an error to report
                serialized = io.BytesIO()
                torch.export.save(program, serialized)
                graph_temp.write_bytes(serialized.getvalue())
            if fmt == "onnx" and prepared.check_raw is not None:
                worst = prepared.check_raw(graph_temp)
            else:
                worst = check(fmt, graph_temp, prepared.reference or module, x)
            sidecar_temp.write_text(json.dumps(sidecar, indent=2) + "\n")
    except OSError as err:  # a full disk is NoRoomError already (src.files.written): one sentence
        raise UserInputError(f"cannot write {str(graph_path)!r} ({err.strerror or err}).") from err
    return graph_path, sidecar_path, worst


def parse(args: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(
        prog="python -m src.apps.export", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--ckpt_path", required=True, help="The checkpoint to export (a .ckpt file).")
    parser.add_argument("--format", default="onnx", help=f"One of {', '.join(FORMATS)} (default onnx).")
    parser.add_argument(
        "--output",
        default=None,
        help="Where to write the graph; the sidecar goes to <output>.json. Default: beside the checkpoint.",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="Replace the graph and sidecar files if they exist."
    )
    return parser.parse_args(args)


class _Parser(argparse.ArgumentParser):
    """argparse whose complaints are one sentence and exit status 2, like every other bad input here."""

    def error(self, message: str) -> Any:
        raise UserInputError(f"{message}; see python -m src.apps.export --help.")


def main(args: Sequence[str] | None = None) -> None:
    """Run the command; bad input ends with one sentence on stderr and exit status 2."""
    try:
        options = parse(args)
        graph, sidecar, worst = export(options.ckpt_path, options.format, options.output, options.overwrite)
    except UserInputError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    except ExportCheckError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from err
    tolerance = TOLERANCES[options.format]
    print(
        f"Exported {options.ckpt_path} to {graph} ({options.format}) with its preprocessing in {sidecar}; "
        f"checked against the checkpoint: largest difference {worst:.2g} "
        f"(allowed {tolerance.atol:g} + {tolerance.rtol:g} * |value|)."
    )
