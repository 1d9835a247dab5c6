"""Images after training: :class:`Predictor` reads images as ``predict`` does, through the model's own
``predict_step``, and a file that is no image is one sentence."""

from dataclasses import replace
from pathlib import Path

import lightning as L
import pandas as pd
import pytest
import torch
from PIL import Image

from src.cli import main
from src.errors import UserInputError
from src.extras.images import ImageDataModule, decode
from src.extras.images.conftest import PROBABILITIES
from src.extras.images.predict import ImagePreprocessing
from src.predict import Predictor
from tests.conftest import QUIET


@pytest.fixture(scope="module")
def predictor(image_checkpoint: Path) -> Predictor:
    return Predictor.from_checkpoint(image_checkpoint)


# -- Predictor on images --------------------------------------------------------------------------------


def test_images_are_read_as_the_datamodule_reads_them_to_predict(
    predictor: Predictor, image_checkpoint: Path, new_images: list[Path]
) -> None:
    data = ImageDataModule(
        preprocessing_from=str(image_checkpoint), predict_path=[str(p) for p in new_images]
    )
    expected = data.dataset("predict").tensors[0].permute(0, 2, 3, 1)  # type: ignore[attr-defined]
    assert expected.shape == (12, 8, 8, 1)
    files = predictor.read(new_images)
    as_bytes = predictor.read([p.read_bytes() for p in new_images])
    with Image.open(new_images[0]) as opened:
        as_pil = predictor.read([opened])
    torch.testing.assert_close(files, expected, rtol=0, atol=0)
    torch.testing.assert_close(as_bytes, expected, rtol=0, atol=0)
    torch.testing.assert_close(as_pil, expected[:1], rtol=0, atol=0)
    # and the normalization is the DataModule's, to the bit
    torch.testing.assert_close(
        predictor.graph.normalize(files),
        data.normalize(expected.permute(0, 3, 1, 2).float() / 255),
        rtol=0,
        atol=0,
    )


class Hotter(L.LightningModule):
    """A trained net with a (sharpening) temperature in its predict_step, as a user's module might have."""

    def __init__(self, trained: L.LightningModule) -> None:
        super().__init__()
        self.trained = trained

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.trained(x)

    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> dict[str, torch.Tensor]:
        probs = torch.softmax(self(batch[0]) / 0.01, dim=-1)
        return {"probs": probs, "preds": probs.argmax(dim=-1)}


def test_images_and_rows_share_one_predictor_which_answers_through_the_models_predict_step(
    predictor: Predictor, new_images: list[Path]
) -> None:
    hotter = Predictor(Hotter(predictor.model), predictor.reading, device="cpu")
    assert type(hotter) is type(predictor) is Predictor
    frame = hotter.predict(new_images)
    with torch.inference_mode():
        logits = hotter.model(hotter.graph.normalize(hotter.read(new_images)))  # type: ignore[union-attr]
    expected = torch.softmax(logits / 0.01, dim=-1)
    torch.testing.assert_close(torch.tensor(frame[PROBABILITIES].to_numpy(), dtype=torch.float32), expected)
    # the edit changed the answer: the shipped predict_step's probabilities are not these
    shipped = predictor.predict(new_images)[PROBABILITIES].to_numpy()
    assert abs(shipped - frame[PROBABILITIES].to_numpy()).max() > 0.05


def test_a_run_that_resized_resizes_as_the_datamodule_and_one_that_did_not_refuses(
    predictor: Predictor, new_images: list[Path]
) -> None:
    resized = replace(image_reading(predictor), mode="RGB", size=(6, 5), resize=True)
    for path in new_images[:3]:
        expected = decode(path, "RGB", (6, 5), resize=True).permute(1, 2, 0)  # (H, W, C)
        torch.testing.assert_close(resized.read(path, "x"), expected, rtol=0, atol=0)
    fixed = replace(image_reading(predictor), size=(6, 5))
    with pytest.raises(UserInputError) as err:
        fixed.read(new_images[0].read_bytes(), "images[2]")
    assert str(err.value) == (
        "images[2] is 8x8 but the model was trained on 5x6 images without resizing; send images of that size."
    )


def test_predict_equals_the_cli_predict_csv(
    predictor: Predictor, predicted_images: pd.DataFrame, new_images: list[Path]
) -> None:
    frame = predictor.predict(new_images)
    assert list(frame.columns) == list(predicted_images.columns) == ["path", "prediction", *PROBABILITIES]
    assert frame["path"].tolist() == predicted_images["path"].tolist() == [str(p) for p in new_images]
    assert frame["prediction"].tolist() == predicted_images["prediction"].tolist()
    torch.testing.assert_close(
        torch.tensor(frame[PROBABILITIES].to_numpy(), dtype=torch.float32),
        torch.tensor(predicted_images[PROBABILITIES].to_numpy(), dtype=torch.float32),
    )
    assert predicted_images["prediction"].nunique() > 1  # a model that learned: not one class for all
    # bytes give the same lines, numbered by position
    by_bytes = predictor.predict([p.read_bytes() for p in new_images])
    assert by_bytes["row"].tolist() == list(range(len(new_images)))
    pd.testing.assert_frame_equal(by_bytes.drop(columns="row"), frame.drop(columns="path"))


def test_a_file_that_is_no_image_or_a_checkpoint_without_images_is_one_sentence(
    predictor: Predictor, new_images: list[Path], tmp_path: Path
) -> None:
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    with pytest.raises(
        UserInputError, match=rf"^'{text}' cannot be read as an image \(.*\); replace or remove it\.$"
    ):
        predictor.predict([text])
    with pytest.raises(
        UserInputError, match=r"^image 1 cannot be read as an image \(.*\); send a PNG or JPEG"
    ):
        predictor.predict([new_images[0].read_bytes(), b"nothing"])
    with pytest.raises(UserInputError) as err:
        ImagePreprocessing.of({"state_dict": {}, "TabularDataModule": {"preprocessing": {}}}, "t.ckpt")
    assert str(err.value) == (
        "checkpoint 't.ckpt' carries no fitted image statistics (it was not written by a run of "
        "ImageDataModule); train a new one."
    )


def image_reading(predictor: Predictor) -> ImagePreprocessing:
    """The image run's reading the predictor holds."""
    assert isinstance(predictor.reading, ImagePreprocessing)
    return predictor.reading


# -- where predict may write --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("how", ["--output", "the prediction writer's output_path"])
@pytest.mark.parametrize(
    "target",
    ["an image in it", "an image in a sub-folder", "a new file in it", "a hard link to an image in it"],
)
def test_no_output_lands_inside_a_folder_predict_reads_even_when_overwriting(
    image_checkpoint: Path, workdir: Path, capsys, target: str, how: str
) -> None:
    from src.extras.images.test_images import write_images

    folder = write_images(workdir / "imgs" / "a", per_class=2)
    output = {
        "an image in it": folder / "cat" / "000.png",
        "an image in a sub-folder": folder / "dog" / "001.png",
        "a new file in it": folder / "predictions.csv",
        "a hard link to an image in it": workdir / "linked.png",
    }[target]
    if target.startswith("a hard link"):
        output.hardlink_to(folder / "owl" / "000.png")
    before = {path: path.read_bytes() for path in workdir.rglob("*") if path.is_file()}
    option = "--output" if how == "--output" else "--prediction_writer.init_args.output_path"
    words = ["predict", "--ckpt_path", str(image_checkpoint), f"--data.predict_path={folder}"]
    overwrite = "--overwrite=true" if how == "--output" else "--prediction_writer.init_args.overwrite=true"
    with pytest.raises(SystemExit) as exit_:
        main([*words, f"{option}={output}", overwrite, *QUIET])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --output={str(output)!r} is inside {str(folder)!r}, a folder this run reads; name a file "
        "outside it."
    )
    assert {path: path.read_bytes() for path in workdir.rglob("*") if path.is_file()} == before
