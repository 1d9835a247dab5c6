"""Several targets in one table: ``data.target_column: [a, b, c]``. Labels of two values each train a
multi-label Classifier (a sigmoid and BCE per label), numbers a multi-output Regressor (each target
standardized on its own, metrics per target and their mean), through the CLI as a user runs it; the
predictions of new rows hold a column per target, equal to the model's own outputs on the same rows."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from lightning import LightningModule
from sklearn.metrics import f1_score, mean_squared_error, r2_score

from src.cli import main
from src.data.split import Split
from src.errors import UserInputError
from src.extras.tables import TabularDataModule
from src.extras.tables.conftest import TABLE_DATA
from src.extras.tables.options import strata
from src.extras.tables.preprocessing import Location, label_pair
from src.extras.tables.sources import select
from src.models import Classifier, Regressor
from src.nets import MLP
from src.predict import Predictor, prediction_frame
from tests.conftest import BARE, CONFIGS, QUIET, fit_in
from tests.test_errors import fails

# The steps are called here without a Trainer, to compare them with direct computations; Lightning
# warns that their self.log calls then log nothing, which is all these tests need.
pytestmark = pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`:UserWarning")

LABELS = ["high", "wide", "flag"]
#: every extra off, the checkpoint a later command reads on
OFF = [*BARE, "--last_checkpoint=src.callbacks.LatestCheckpoint"]
VALUES = ["y1", "y2"]


def table(n: int = 160, seed: int = 0) -> pd.DataFrame:
    """Numbers and a text column with empty cells, three labels (0/1, yes/no, true/false) and two values
    on scales far apart, each depending on the features."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    frame = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "kind": rng.choice(["p", "q", "r"], n)})
    frame.loc[[4, 9], "a"] = np.nan
    frame.loc[[3, 50], "kind"] = None
    frame["high"] = (x[:, 0] > 0).astype(int)
    frame["wide"] = np.where(x[:, 1] > 0.3, "yes", "no")
    frame["flag"] = x[:, 2] - x[:, 0] > 0  # written True/False
    frame["y1"] = 3 * x[:, 0] + 10 + rng.normal(0, 0.1, n)
    frame["y2"] = 500 + 100 * x[:, 1] * x[:, 2]
    return frame


def mlp() -> MLP:
    return MLP(4, 3, hidden_sizes=[8])


# -- the data: labels, their positive value, the split ----------------------------------------------------


def test_a_labels_positive_value_is_one_true_or_yes_else_the_second_in_sorted_order() -> None:
    where = Location("the rows")

    def pair(*values: object) -> list:
        return label_pair(pd.Series(list(values), name="t"), where)

    assert pair(1, 0, 1) == [0, 1]
    assert pair("yes", "no") == ["no", "yes"]
    assert pair("Yes", "no") == ["no", "Yes"]  # sorted, "Yes" would come first
    assert pair(True, False) == ["False", "True"]
    assert pair("TRUE", "false") == ["false", "TRUE"]
    assert pair("malignant", "benign") == ["benign", "malignant"]
    with pytest.raises(UserInputError, match=r"holds only \['no'\] in the training rows"):
        pair("no", "no")


def test_rows_missing_any_target_are_left_out_with_a_notice(caplog: pytest.LogCaptureFixture) -> None:
    frame = table()
    frame.loc[5, "wide"] = None
    picked = select(frame, LABELS, "classification", Location("the rows"))
    assert list(picked.target.columns) == picked.target_name == LABELS
    assert len(picked.target) == len(picked.features) == 159
    assert (
        "the rows: 1 of 160 rows have no value in one of ['high', 'wide', 'flag'] and are left out."
        in caplog.text
    )
    assert list(picked.features.columns) == ["a", "b", "c", "kind", *VALUES]  # the targets are not features


def test_the_split_is_stratified_by_the_combination_of_labels_when_each_has_rows_enough() -> None:
    combinations = pd.DataFrame({"a": [0, 0, 1, 1] * 10, "b": ["x", "y", "x", "y"] * 10})  # 10 rows each
    by_combination = strata(combinations, Split(val_fraction=0.1, test_fraction=0.2))
    pairs = set(zip(by_combination, combinations["a"], combinations["b"], strict=True))
    assert len(set(by_combination)) == len(pairs) == 4  # one stratum per combination
    # a split of 5 % would leave a combination of 10 rows out of it: the first target's labels then
    by_first = strata(combinations, Split(val_fraction=0.05, test_fraction=0.2))
    np.testing.assert_array_equal(by_first, combinations["a"].to_numpy())
    np.testing.assert_array_equal(strata(combinations["b"], Split()), combinations["b"].to_numpy())


def test_a_list_of_one_column_is_that_column(workdir: Path) -> None:
    table().to_csv("t.csv", index=False)
    runs = [
        main(["--config", str(CONFIGS / "spiral.yaml"), TABLE_DATA, "--data.source=csv", "--data.path=t.csv",
              "--data.task=classification", f"--data.target_column={target}"], run=False)
        for target in ("high", "[high]")
    ]  # fmt: skip
    one, listed = (run.datamodule for run in runs)
    assert dict(listed.hparams) == dict(one.hparams)
    assert listed.hparams["target_column"] == "high"
    assert (listed.out_features, getattr(listed, "target_names", None), listed.label_names) == (
        2,
        None,
        [0, 1],
    )
    assert dict(runs[1].model.hparams) == dict(runs[0].model.hparams)
    saved, listed_saved = one.state_dict(), listed.state_dict()
    assert listed_saved["preprocessing"] == saved["preprocessing"]
    for key in ("items", "splits"):
        torch.testing.assert_close(listed_saved["split"][key], saved["split"][key], rtol=0, atol=0)


def test_a_changed_cell_of_a_second_target_refuses_the_resume(tmp_path: Path) -> None:
    frame = table()
    frame.to_csv(tmp_path / "t.csv", index=False)

    def datamodule() -> TabularDataModule:
        return TabularDataModule(path=str(tmp_path / "t.csv"), target_column=LABELS, task="classification")

    before = datamodule().state_dict()
    datamodule().check_resume(before)  # the same rows: goes on
    frame.loc[7, "wide"] = "no" if frame.loc[7, "wide"] == "yes" else "yes"
    frame.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(UserInputError, match="1 row edited"):
        datamodule().check_resume(before)


@pytest.mark.parametrize(
    ("target", "extra", "sentence"),
    [
        ("[high, kind]", [], "the target 'kind' holds 3 value(s) ['p', 'q', 'r']; with several target "
         "columns each is a label of two values"),
        ("[high, high]", [], "data.target_column=['high', 'high'] must name a column, or several different"),
        ("[high, wide]", [], "column 'copied' is a copy of the target 'wide'"),
        ("[high, flag]", ["--data.encoding.max_categories=2", "--data.encoding.high_cardinality=target"],
         "reads column 'kind' by its means of one target, but data.target_column names 2"),
    ],
    ids=["three-values", "twice", "a-copy", "target-encoding"],
)  # fmt: skip
def test_what_several_targets_cannot_be_is_one_sentence(
    cli, capsys, workdir, target, extra, sentence
) -> None:
    frame = table().assign(copied=lambda f: f["wide"].map({"yes": "W", "no": "N"}))  # the answer, renamed
    frame.to_csv("t.csv", index=False)
    line = fails(
        cli, capsys, "--config", "spiral.yaml", TABLE_DATA, "--data.source=csv", "--data.path=t.csv",
        "--data.task=classification", f"--data.target_column={target}", *extra,
    )  # fmt: skip
    assert sentence in line
    assert ". " not in line
    assert line.endswith(".")


class AsksForTargets(LightningModule):
    """A module of the user's own that asks for the data's target columns."""

    def __init__(self, in_features: int, out_features: int, target_names: list[str] | None = None) -> None:
        super().__init__()
        self.shapes = (in_features, out_features, target_names)


class TakesShapesOnly(LightningModule):
    """One that does not: the link leaves it alone, as it leaves a module without in_features."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.shapes = (in_features, out_features)


@pytest.mark.parametrize("module", [AsksForTargets, TakesShapesOnly], ids=lambda m: m.__name__)
def test_a_module_of_ones_own_gets_the_target_names_by_asking_for_them(workdir: Path, module: type) -> None:
    table().to_csv("t.csv", index=False)
    run = main(
        ["--config", str(CONFIGS / "spiral.yaml"), f"--model={__name__}.{module.__name__}",
         TABLE_DATA, "--data.source=csv", "--data.path=t.csv", "--data.task=classification",
         f"--data.target_column=[{', '.join(LABELS)}]"],
        run=False,
    )  # fmt: skip
    asked = (LABELS,) if module is AsksForTargets else ()
    assert run.model.shapes == (run.datamodule.in_features, 3, *asked)


# -- the tasks: BCE per label, metrics at 0.5, values per target -------------------------------------------


def test_the_multilabel_loss_is_bce_per_label_smoothed_as_cross_entropy_smooths_two_classes() -> None:
    torch.manual_seed(0)
    model = Classifier(
        in_features=4, out_features=3, target_names=LABELS, net=lambda i, o: mlp(), label_smoothing=0.2,
        class_weights=True,
    )  # fmt: skip
    model.class_weight.copy_(torch.tensor([2.0, 0.5, 1.0]))  # the training rows' negatives over positives
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16, 3))
    logits = model.net(x)
    loss = model.training_step((x, y), 0)
    z, t, w = logits.flatten(), y.flatten().float(), model.class_weight.repeat(16)
    p, s = torch.sigmoid(z), 0.2
    soft = t * (1 - s) + s / 2
    by_hand = -(w * soft * torch.log(p) + (1 - soft) * torch.log(1 - p)).mean()
    torch.testing.assert_close(loss, by_hand)
    # unweighted, the same number as a cross-entropy of each label's two classes (logits 0 and z)
    model.class_weight.fill_(1.0)
    two_classes = F.cross_entropy(torch.stack([torch.zeros_like(z), z], 1), y.flatten(), label_smoothing=s)
    torch.testing.assert_close(model.loss(logits, y), two_classes)


def test_multilabel_metrics_and_predictions_threshold_each_label_at_half() -> None:
    torch.manual_seed(0)
    model = Classifier(in_features=4, out_features=3, target_names=LABELS, net=lambda i, o: mlp()).eval()
    x, y = torch.randn(40, 4), torch.randint(0, 2, (40, 3))
    model.test_step((x, y), 0)
    out = model.predict_step((x,), 0)
    probs = torch.sigmoid(model.net(x)).detach()
    torch.testing.assert_close(out["probs"], probs)  # each label's own: no softmax across them
    assert out["preds"].shape == (40, 3)
    torch.testing.assert_close(out["preds"], (probs > 0.5).long())
    p, t = out["preds"].numpy(), y.numpy()
    computed = model.test_metrics.compute()
    assert computed["test/acc"].item() == pytest.approx((p == t).mean())
    assert computed["test/f1"].item() == pytest.approx(f1_score(t, p, average="macro", zero_division=0))


def test_several_values_are_each_standardized_and_measured_on_their_own() -> None:
    torch.manual_seed(0)
    model = Regressor(in_features=4, out_features=2, target_names=VALUES, net=lambda i, o: MLP(i, o, [8]))
    y = torch.stack([10 + 3 * torch.randn(30), 500 + 100 * torch.randn(30)], 1)
    model.fit_target_scaling(y.numpy())
    torch.testing.assert_close(model.target_mean, y.double().mean(0).float())
    torch.testing.assert_close(model.target_std, y.double().std(0, unbiased=False).float())
    x = torch.randn(30, 4)
    out = model.net(x)  # (B, 2) in standardized units
    scaled = (y - model.target_mean) / model.target_std
    torch.testing.assert_close(model.training_step((x, y), 0), F.mse_loss(out, scaled))
    model.test_step((x, y), 0)
    preds = model.predict_step((x,), 0)["preds"].detach().numpy()
    np.testing.assert_allclose(
        preds, (out * model.target_std + model.target_mean).detach().numpy(), rtol=1e-6
    )
    computed = model.test_metrics.compute()  # (2,) each: logged per target and as their mean
    np.testing.assert_allclose(computed["test/r2"], r2_score(y, preds, multioutput="raw_values"), atol=1e-5)
    rmse = mean_squared_error(y, preds, multioutput="raw_values") ** 0.5
    np.testing.assert_allclose(computed["test/rmse"], rmse, rtol=1e-5)


def test_a_prediction_per_target_named_by_its_column() -> None:
    probs = torch.tensor([[0.9, 0.2, 0.6], [0.1, 0.7, 0.4]])
    outputs = {"probs": probs, "preds": (probs > 0.5).long()}
    pairs = [[0, 1], ["no", "yes"], ["False", "True"]]
    frame = prediction_frame(outputs, pairs, pd.Index([7, 3], name="row"), LABELS)
    assert list(frame.columns) == [
        "row",
        *(f"prediction({name})" for name in LABELS),
        *(f"probability({name})" for name in LABELS),
    ]
    assert frame["row"].tolist() == [7, 3]
    assert frame[[f"prediction({name})" for name in LABELS]].values.tolist() == [
        [1, "no", "True"],
        [0, "yes", "False"],
    ]
    np.testing.assert_array_equal(
        frame[[f"probability({name})" for name in LABELS]].to_numpy(), probs.numpy()
    )
    values = torch.tensor([[10.5, 480.0], [7.25, 520.0]])
    frame = prediction_frame({"preds": values}, None, pd.Index([0, 1], name="row"), VALUES)
    assert list(frame.columns) == ["row", "prediction(y1)", "prediction(y2)"]
    np.testing.assert_array_equal(frame[["prediction(y1)", "prediction(y2)"]].to_numpy(), values.numpy())


# -- through the CLI: fit, test, predict --------------------------------------------------------------------


def fitted(folder: Path, config: str, task: str, targets: list[str], *words: str):
    """A short fit of ``table()`` from ``folder`` with extras off, and its last checkpoint."""
    table().to_csv(folder / "t.csv", index=False)
    run = fit_in(
        folder, "--config", str(CONFIGS / config), *OFF, TABLE_DATA,
        "--data.source=csv", "--data.path=t.csv", f"--data.task={task}",
        f"--data.target_column=[{', '.join(targets)}]", "--data.batch_size=32", *words,
    )  # fmt: skip
    return run, Path(run.trainer.log_dir) / "checkpoints" / "last.ckpt"


def evaluated(folder: Path, run, checkpoint: Path, monkeypatch) -> tuple[dict, pd.DataFrame, torch.Tensor]:
    """``test`` of the checkpoint, and ``predict`` of the validation rows' raw features written to a new
    file: the test metrics, the CSV file, and the validation rows as the run encoded them."""
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", ["src.cli"])  # pytest's own words must not look like the CLI's
    metrics = main(["test", "--ckpt_path", str(checkpoint), *OFF, *QUIET]).trainer.callback_metrics
    rows = run.datamodule.table.features.iloc[run.datamodule.split_rows["val"]].reset_index(drop=True)
    rows.to_csv(folder / "new.csv", index=False)
    main([
        "predict", "--ckpt_path", str(checkpoint), "--data.predict_path=new.csv", "--output=out.csv", *OFF,
        "--prediction_writer=src.callbacks.PredictionWriter", *QUIET,
    ])  # fmt: skip
    written = pd.read_csv(folder / "out.csv")
    # the Python API is the same path: the same table from the checkpoint alone
    api = Predictor.from_checkpoint(checkpoint).predict(pd.read_csv(folder / "new.csv"))
    # labels as text: the CSV reader takes True/False back as booleans and 0/1 as numbers
    labels = {
        name: str
        for name in api.columns
        if name.startswith("prediction(") and not pd.api.types.is_float_dtype(api[name])
    }
    pd.testing.assert_frame_equal(api.astype(labels), written.astype(labels), check_dtype=False, rtol=1e-6)
    return metrics, written, run.datamodule.dataset("val").tensors[0]


@pytest.mark.slow
def test_three_labels_train_test_and_predict_a_column_each(tmp_path: Path, monkeypatch) -> None:
    run, checkpoint = fitted(
        tmp_path, "spiral.yaml", "classification", LABELS, "--model.init_args.class_weights=true",
        "--model.init_args.label_smoothing=0.1",
    )  # fmt: skip
    model, data = run.model, run.datamodule
    assert (model.hparams["out_features"], model.hparams["target_names"]) == (3, LABELS)
    pairs = [[0, 1], ["no", "yes"], ["False", "True"]]
    assert data.label_names == pairs
    carried = torch.load(checkpoint, weights_only=True)["TabularDataModule"]["preprocessing"]
    assert (carried["target"], carried["labels"]) == (LABELS, pairs)
    # pos_weight per label: the training rows' negatives over positives
    train = table().iloc[data.split_rows["train"]]
    positives = np.array([(train["high"] == 1).sum(), (train["wide"] == "yes").sum(), train["flag"].sum()])
    np.testing.assert_allclose(model.class_weight, (len(train) - positives) / positives, rtol=1e-6)
    assert {"val/acc", "val/f1", "train/loss"} <= run.trainer.callback_metrics.keys()

    metrics, written, x = evaluated(tmp_path, run, checkpoint, monkeypatch)
    x_test, y_test = data.dataset("test").tensors
    model.eval()
    with torch.no_grad():
        test_preds = (torch.sigmoid(model(x_test)) > 0.5).long().numpy()
        probs = torch.sigmoid(model(x)).numpy()  # the model's own outputs on the predicted rows
    assert metrics["test/acc"].item() == pytest.approx((test_preds == y_test.numpy()).mean(), rel=1e-6)
    f1 = f1_score(y_test.numpy(), test_preds, average="macro", zero_division=0)
    assert metrics["test/f1"].item() == pytest.approx(f1, rel=1e-5)
    assert list(written.columns) == [
        "row",
        *(f"prediction({name})" for name in LABELS),
        *(f"probability({name})" for name in LABELS),
    ]
    assert written["row"].tolist() == list(range(len(x)))
    np.testing.assert_allclose(written[[f"probability({name})" for name in LABELS]], probs, rtol=1e-5)
    for k, name in enumerate(LABELS):
        expected = [str(pairs[k][int(p > 0.5)]) for p in probs[:, k]]
        assert written[f"prediction({name})"].astype(str).tolist() == expected, name


@pytest.mark.slow
def test_two_values_train_test_and_predict_a_column_each(tmp_path: Path, monkeypatch) -> None:
    run, checkpoint = fitted(
        tmp_path, "friedman.yaml", "regression", VALUES, "--model.init_args.net.init_args.hidden_sizes=[16]"
    )
    model, data = run.model, run.datamodule
    assert (model.hparams["out_features"], model.hparams["target_names"]) == (2, VALUES)
    train = table()[VALUES].to_numpy(np.float32)[data.split_rows["train"]].astype(np.float64)
    np.testing.assert_allclose(model.target_mean, train.mean(0), rtol=1e-5)
    np.testing.assert_allclose(model.target_std, train.std(0), rtol=1e-5)
    logged = run.trainer.callback_metrics
    for metric in ("mae", "rmse", "r2"):
        per_target = [logged[f"val/{metric}({name})"].item() for name in VALUES]
        assert logged[f"val/{metric}"].item() == pytest.approx(np.mean(per_target), rel=1e-5)

    metrics, written, x = evaluated(tmp_path, run, checkpoint, monkeypatch)
    x_test, y_test = data.dataset("test").tensors
    model.eval()
    with torch.no_grad():
        test_preds = model.to_original_units(model(x_test)).numpy()
        values = model.to_original_units(model(x)).numpy()
    r2 = r2_score(y_test.numpy(), test_preds, multioutput="raw_values")
    for k, name in enumerate(VALUES):
        assert metrics[f"test/r2({name})"].item() == pytest.approx(r2[k], rel=1e-4, abs=1e-5)
    assert metrics["test/r2"].item() == pytest.approx(r2.mean(), rel=1e-4, abs=1e-5)
    assert list(written.columns) == ["row", "prediction(y1)", "prediction(y2)"]
    np.testing.assert_allclose(written[["prediction(y1)", "prediction(y2)"]], values, rtol=1e-5)
