"""Ship a checkpoint to another runtime: an ONNX or ``torch.export`` graph, and a JSON sidecar beside it.

    python -m src.apps.export --ckpt_path CKPT --format onnx --output model.onnx     # make export CKPT=...
    python -m src.apps.export --ckpt_path CKPT --format torch-export --output model.pt2

Two files are written: the graph at ``--output`` (left out: beside the checkpoint, ``.onnx`` or
``.pt2``) and the sidecar at ``<output>.json``. Both are first written under temporary names in the
destination folder and renamed only after the check below passed, so a failed export leaves nothing;
neither may be the checkpoint, and an existing file is replaced only with ``--overwrite``.

**An image checkpoint** (a run of :class:`src.data.images.ImageDataModule`) gives a graph that takes
``images``, uint8 pixels ``(B, H, W, C)`` as decoded files stack (B dynamic), and holds the float
conversion, the standardization with the run's statistics and the net; it returns ``logits`` ``(B, K)``.
Its sidecar's ``graph`` says the ``layout``, ``dtype``, ``mode``, ``size``; its ``preprocessing`` the
``labels``, ``resize``, ``mean`` and ``std`` (already inside the graph); its ``recipe``
(:data:`IMAGE_RECIPE`) how a file becomes a row of the input. What follows is the table case.

**The graph** takes ``features``, the encoded float32 matrix ``(B, F)`` that
:meth:`src.predict.Predictor.encode` makes (B dynamic, F = ``len(feature_names)``; the numeric scaling
is part of that encoding, outside the graph), and returns

- classification: ``logits`` ``(B, K)``; a softmax over the last axis gives the probabilities that
  ``predict`` reports, and class ``k`` is ``preprocessing.labels[k]``;
- regression: ``values`` ``(B,)``, in the target's units.

ONNX runs in onnxruntime (or any ONNX runtime); the ``torch.export`` program loads with
``torch.export.load(path).module()`` and needs neither this project nor Lightning.

**The sidecar** (``format_version`` 1) says how raw columns become that matrix, so that a runtime
without Python can do it. It is :meth:`Preprocessor.state_dict` and
:attr:`Preprocessor.feature_names` written out, nothing computed twice:

- ``graph``: ``file``, ``format`` (``onnx`` or ``torch-export``), ``input`` (``"features"``),
  ``output`` (``"logits"`` or ``"values"``), ``in_features`` (F);
- ``feature_names``: one name per column of the matrix, in order;
- ``missing_category``: the category a missing categorical cell becomes;
- ``preprocessing``: ``task``, ``target``, ``labels`` (class-id order, or null), ``numeric``
  (per column, in order: ``name``, ``fill``, ``mean``, ``scale``, ``indicator``, ``missing_tokens``),
  ``categorical`` (per column, in order: ``name``, ``categories``, ``other``), ``version``;
- ``recipe``: the rules below, as sentences.

The rules (:mod:`src.data.preprocessing` applies them; ``tests/test_export.py`` re-implements them from
the sidecar alone and holds the two equal):
"""

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import pandas as pd
import torch
from torch import nn

from src.data.preprocessing import MISSING, Preprocessor
from src.errors import UserInputError
from src.files import check_output, written
from src.image_predict import ImagePredictor, ImagePreprocessing, carries_images
from src.models import BaseTask
from src.predict import Predictor

Format = Literal["onnx", "torch-export"]
FORMATS: tuple[str, ...] = get_args(Format)
SUFFIXES: dict[str, str] = {"onnx": ".onnx", "torch-export": ".pt2"}
SIDECAR_VERSION = 1

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
    "class k is labels[k]; regression: values (B,) in the target's units.",
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
    """The part of a task a graph can hold: ``(B, F)`` encoded rows → logits ``(B, K)`` or values ``(B,)``.

    Classification keeps the logits (the model's ``forward``); regression goes through ``predict_step``,
    which puts the values back into the target's units.
    """

    def __init__(self, model: BaseTask, classification: bool) -> None:
        super().__init__()
        self.model = model
        self.classification = classification

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.classification:
            return self.model(features)  # (B, K) raw logits
        return self.model.predict_step((features,), 0)["preds"]  # (B,) in the target's units


def image_sidecar_of(preprocessing: ImagePreprocessing, graph_file: str, fmt: str) -> dict[str, Any]:
    """An image checkpoint's sidecar: how to call the graph, and what the run fitted and how it read files."""
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


def probe_images(preprocessing: ImagePreprocessing, images: int = 8, seed: int = 0) -> torch.Tensor:
    """uint8 ``(B, H, W, C)`` pixels drawn at random over 0…255: every input value the graph can see."""
    shape = (images, *preprocessing.size, preprocessing.channels)
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8))


def sidecar_of(preprocessor: Preprocessor, graph_file: str, fmt: str, in_features: int) -> dict[str, Any]:
    """The sidecar's content: the checkpoint's preprocessing as it is saved, plus how to call the graph."""
    return {
        "format_version": SIDECAR_VERSION,
        "graph": {
            "file": graph_file,
            "format": fmt,
            "input": "features",
            "output": output_name(preprocessor),
            "in_features": in_features,
        },
        "feature_names": preprocessor.feature_names,
        "missing_category": MISSING,
        "preprocessing": preprocessor.state_dict(),
        "recipe": list(RECIPE),
    }


def output_name(preprocessor: Preprocessor) -> str:
    return "logits" if preprocessor.labels is not None else "values"


def probe_rows(preprocessor: Preprocessor, rows: int = 8, seed: int = 0) -> pd.DataFrame:
    """Raw rows that reach every part of the encoding: numbers around each column's training mean, a
    missing cell in every column, every category, and a value no training row had."""
    rng = np.random.default_rng(seed)
    columns: dict[str, list[Any]] = {}
    for numeric in preprocessor.numeric:
        values: list[Any] = list(numeric.mean + numeric.scale * rng.standard_normal(rows))
        values[0] = None
        columns[numeric.name] = values
    for categorical in preprocessor.categorical:
        choices = [None, "(a value no training row had)", *categorical.categories]
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


def check(fmt: str, path: Path, reference: nn.Module, x: torch.Tensor) -> float:
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


@dataclass(frozen=True)
class Prepared:
    """What one checkpoint exports: the module the graph holds (also the reference of the check), an
    example input, the graph's input and output names, and its sidecar given ``(graph file, format)``."""

    module: nn.Module
    example: torch.Tensor
    input: str
    output: str
    sidecar: Callable[[str, str], dict[str, Any]]


def table_export(ckpt_path: str | Path) -> Prepared:
    """A table checkpoint: encoded rows ``(B, F)`` in, its preprocessing in the sidecar."""
    predictor = Predictor.from_checkpoint(ckpt_path)  # one sentence for a missing or unsafe file
    preprocessor = predictor.preprocessor
    module = Exportable(predictor.model, classification=preprocessor.labels is not None).eval()
    x = predictor.encode(probe_rows(preprocessor), "the probe rows")  # (8, F)
    return Prepared(
        module,
        x,
        "features",
        output_name(preprocessor),
        lambda file, fmt: sidecar_of(preprocessor, file, fmt, x.shape[1]),
    )


def image_export(ckpt_path: str | Path) -> Prepared:
    """An image checkpoint: uint8 pixels ``(B, H, W, C)`` in, normalization and net inside the graph."""
    predictor = ImagePredictor.from_checkpoint(ckpt_path)
    preprocessing = predictor.preprocessing
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
    prepared = image_export(ckpt_path) if carries_images(ckpt_path) else table_export(ckpt_path)
    option = "--output" if output is not None else "the default output beside the checkpoint"
    graph_path = Path(output) if output is not None else Path(ckpt_path).with_suffix(SUFFIXES[fmt])
    check_output(graph_path, [ckpt_path], overwrite, option)
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
                onnx_program.save(graph_temp)
            else:
                torch.export.save(program, graph_temp)
            worst = check(fmt, graph_temp, module, x)
            sidecar_temp.write_text(json.dumps(sidecar, indent=2) + "\n")
    except OSError as err:
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


if __name__ == "__main__":
    main()
