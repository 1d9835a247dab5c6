"""Columns as they come: kinds inferred, fitted on training rows only, applied as scikit-learn would."""

import dataclasses
import logging
import os
import weakref
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from sklearn.model_selection import StratifiedKFold
from sklearn.preprocessing import TargetEncoder

from src.errors import UserInputError
from src.extras.tables import Columns, Encoding, TabularDataModule, preprocessing, sources
from src.extras.tables.preprocessing import (
    MISSING,
    CellReport,
    Location,
    Preprocessor,
    encoder_input,
    fit_column_transformer,
    infer_kinds,
    label_values,
)

#: the messy frame's classes, in class-id order
LABELS = ["high", "low", "mid"]


def messy_frame(n: int = 200, seed: int = 0) -> pd.DataFrame:
    """What real tables hold: text categories, yes/no as words, booleans, empty cells, a "?" among
    numbers, a many-valued text column, and class labels written as names that depend on the rest."""
    rng = np.random.default_rng(seed)
    income = rng.normal(50, 10, n).round(2)
    region = rng.choice(["north", "south", "east", "west"], n, p=[0.4, 0.3, 0.2, 0.1])
    member = rng.choice(["yes", "no"], n)
    age = rng.integers(18, 80, n).astype(object)
    age[[5, 77]] = "?"
    frame = pd.DataFrame(
        {
            "income": np.where(np.arange(n) % 9 == 0, np.nan, income),
            "region": np.where(np.arange(n) % 13 == 0, None, region),
            "member": member,
            "age": age,
            "verified": rng.choice([True, False], n),
            "city": [f"city{k}" for k in rng.integers(0, 30, n)],
        }
    )
    score = np.nan_to_num(income - 50) / 10 + (region == "north") - (member == "no")
    frame["label"] = np.where(score > 0.5, "high", np.where(score < -0.5, "low", "mid"))
    return frame


@pytest.fixture
def messy_csv(tmp_path: Path) -> Path:
    path = tmp_path / "messy.csv"
    messy_frame().to_csv(path, index=False)
    return path


def data(
    path: Path,
    target_column: str = "label",
    task: str = "classification",
    columns: Columns | None = None,
    **encoding: Any,
) -> TabularDataModule:
    """The messy table's DataModule, its encoding as given (``missing_indicator=True`` ...)."""
    options = Encoding(**({"max_categories": 4, "high_cardinality": "other"} | encoding))
    return TabularDataModule(
        path=str(path), target_column=target_column, task=task, columns=columns, encoding=options
    )


def test_column_kinds_are_read_from_the_data_and_can_be_named(messy_csv: Path, caplog) -> None:
    frame = pd.read_csv(messy_csv).drop(columns="label")
    with caplog.at_level(logging.INFO):
        numeric, categorical, tokens = infer_kinds(frame, Location("messy.csv", 2))
    assert numeric == ["income", "age"]
    assert categorical == ["region", "member", "verified", "city"]
    # "?" among the ages is read as missing, and the user is told so, naming the column and the text
    assert tokens == {"age": ["?"]}
    assert "Column 'age': 2 cell(s) holding ['?'] are read as missing" in caplog.text
    numeric, categorical, _ = infer_kinds(frame, Location("messy.csv", 2), categorical=["age"])
    assert "age" in categorical
    assert "age" not in numeric


@pytest.mark.parametrize(
    ("column_by_column", "many", "task"),
    [(False, "other", "classification"), (True, "other", "classification"),
     (False, "target", "classification"), (False, "target", "regression")],
)  # fmt: skip
def test_transform_equals_the_fitted_scikit_learn_column_transformer(
    messy_csv: Path, column_by_column: bool, many: str, task: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if column_by_column:  # numeric columns fitted one block (of one column) at a time, as for big tables
        monkeypatch.setattr(preprocessing, "FIT_BLOCK_CELLS", 1)
    if task == "regression":  # a number to predict: the income of the rest
        frame = pd.read_csv(messy_csv).drop(columns="label")
        (messy_csv := messy_csv.with_name("income.csv")).write_text(frame.to_csv(index=False))
    target = {"target_column": "income", "task": "regression"} if task == "regression" else {}
    dm = data(messy_csv, missing_indicator=True, high_cardinality=many, **target)
    train = dm.split_rows["train"]  # the scikit-learn pipeline fitted whole on the train split
    fitted = fit_column_transformer(
        dm.table.features.iloc[train], dm._kinds(), dm._options(), dm.table.location, dm.table.task,
        dm.table.target.iloc[train],
    )  # fmt: skip
    table, prep = dm.table, dm.preprocessor
    kinds = infer_kinds(table.features, table.location)
    for stage in ("train", "val", "test"):
        rows = table.features.iloc[dm.split_rows[stage]]
        expected = fitted.transform(encoder_input(rows, kinds[0], kinds[1], table.location, kinds[2]))
        torch.testing.assert_close(dm.dataset(stage).tensors[0], torch.tensor(expected, dtype=torch.float32))
    # rows the training split never saw: unknown categories, empty cells, a "?", another column order
    new = pd.DataFrame(
        {
            "city": ["city999", "city1", None],
            "age": ["?", 30, 41],
            "verified": [True, None, False],
            "member": ["maybe", "yes", "no"],
            "region": ["atlantis", None, "north"],
            "income": [None, 1e6, 49.5],
            "ignored": [1, 2, 3],
        }
    )
    expected = fitted.transform(encoder_input(new, kinds[0], kinds[1], table.location, kinds[2]))
    np.testing.assert_allclose(prep.transform(new, Location("new rows")), expected, rtol=1e-6, atol=1e-6)
    # and the encoded layout is what the names say
    if task == "regression":
        assert prep.feature_names[:2] == ["age", "age (missing)"]
        assert prep.feature_names[-2:] == ["region (mean target)", "city (mean target)"]
    elif many == "other":
        assert prep.feature_names[:4] == ["income", "age", "income (missing)", "age (missing)"]
        assert "region=(other)" in prep.feature_names  # max_categories=4: the rarest region shares a column
    else:  # 5 regions and 30 cities: one column per class each, after the one-hot blocks
        assert prep.feature_names[-6:] == [f"{c} (mean {k})" for c in ("region", "city") for k in LABELS]
        assert [c.name for c in prep.categorical] == ["member", "verified", "region", "city"]


def test_a_column_of_many_values_is_read_as_its_target_means_fitted_on_the_training_rows(
    messy_csv: Path, caplog
) -> None:
    with caplog.at_level(logging.INFO):
        dm = data(messy_csv, high_cardinality="target")
        prep = dm.preprocessor
    city = next(c for c in prep.categorical if c.name == "city")
    train = dm.split_rows["train"]
    seen = sorted(set(dm.table.features["city"].iloc[train]))
    assert city.categories == seen  # the training rows' values alone, every one of them
    assert city.encodings is not None
    assert city.default is not None
    # scikit-learn's TargetEncoder on the training rows, scaled as the cross-fitted training rows are
    labels = label_values(dm.table.target.iloc[train])
    folds = StratifiedKFold(5, shuffle=True, random_state=0)
    encoder = TargetEncoder(target_type="multiclass", cv=folds)
    cells = dm.table.features[["city"]].iloc[train].astype(str)
    ids = pd.Index(LABELS).get_indexer(labels)
    crossed = encoder.fit_transform(cells, ids)
    mean, std = crossed.mean(0), crossed.std(0)
    expected = (np.stack(encoder.encodings_, axis=1) - mean) / std
    np.testing.assert_allclose(city.encodings, expected, rtol=1e-12)
    np.testing.assert_allclose(city.default, (encoder.target_mean_ - mean) / std, rtol=1e-12)
    # a city never seen reads as the training mean, and is counted
    report = CellReport()
    row = messy_frame().iloc[[0]].assign(city="city999")
    x = prep.transform(row, Location("one row"), report=report)
    at = prep.feature_names.index(f"city (mean {LABELS[0]})")
    np.testing.assert_allclose(x[0, at : at + 3], np.float32(city.default))
    assert report.columns["city"].read_as == "the training mean"
    # the notice says what it did and which settings change it
    assert "Column 'city' has 30 distinct values" in caplog.text
    assert "data.encoding.high_cardinality: target; other gives one-hot columns" in caplog.text
    assert "data.encoding.max_categories=4" in caplog.text


def test_unseen_values_land_in_the_other_column_or_nowhere(messy_csv: Path) -> None:
    prep = data(messy_csv).preprocessor
    member = next(c for c in prep.categorical if c.name == "member")
    assert (member.categories, member.other) == (["no", "yes"], False)
    region = next(c for c in prep.categorical if c.name == "region")
    assert region.other  # 5 values (4 regions and MISSING) for 4 columns: the rarest share one
    x = prep.transform(
        pd.DataFrame(
            {
                "income": [50.0],
                "age": [30],
                "region": ["atlantis"],
                "member": ["maybe"],
                "verified": [True],
                "city": ["city1"],
            }
        ),
        Location("one row"),
    )
    names = prep.feature_names
    assert x[0, names.index("region=(other)")] == 1.0
    assert x[0, [i for i, n in enumerate(names) if n.startswith("member=")]].sum() == 0.0


def test_everything_is_fitted_on_the_training_rows_only(messy_csv: Path) -> None:
    dm = data(messy_csv, missing_indicator=True)
    frame = pd.read_csv(messy_csv)
    held_out = np.concatenate([dm.split_rows["val"], dm.split_rows["test"]])
    frame.loc[held_out, "income"] = frame.loc[held_out, "income"] * 100 + 50
    frame.loc[held_out, "region"] = "moved away"
    frame.loc[held_out, "age"] = np.nan
    path = messy_csv.with_name("perturbed.csv")
    frame.to_csv(path, index=False)
    perturbed = data(path, missing_indicator=True)
    np.testing.assert_array_equal(perturbed.split_rows["train"], dm.split_rows["train"])
    assert perturbed.preprocessor == dm.preprocessor
    torch.testing.assert_close(perturbed.dataset("train").tensors[0], dm.dataset("train").tensors[0])
    assert not torch.equal(perturbed.dataset("val").tensors[0], dm.dataset("val").tensors[0])
    income = next(c for c in dm.preprocessor.numeric if c.name == "income")
    train_income = pd.read_csv(messy_csv).loc[dm.split_rows["train"], "income"]
    assert income.fill == pytest.approx(train_income.median())
    assert income.mean == pytest.approx(train_income.fillna(train_income.median()).mean())


def test_labels_as_they_come(messy_csv: Path, tmp_path: Path, caplog) -> None:
    dm = data(messy_csv)
    assert dm.label_names == ["high", "low", "mid"]
    frame = pd.read_csv(messy_csv)
    expected = pd.Index(["high", "low", "mid"]).get_indexer(frame["label"].iloc[dm.split_rows["train"]])
    np.testing.assert_array_equal(dm.dataset("train").tensors[1].numpy(), expected)
    # integer labels stay integers (not "0", "1"); rows without a label are left out, with a notice
    frame["label"] = frame["label"].map({"low": 10, "mid": 20, "high": 30}).astype(float)
    frame.loc[[3, 4, 5], "label"] = np.nan
    path = tmp_path / "numbered.csv"
    frame.to_csv(path, index=False)
    with caplog.at_level(logging.INFO):
        numbered = data(path)
        assert numbered.label_names == [10, 20, 30]
    assert f"CSV file '{path}': 3 of 200 rows have no 'label' and are left out." in caplog.text
    assert not {3, 4, 5} & set(numbered.table.features.index)


def test_a_label_the_training_rows_never_had_is_named(messy_csv: Path) -> None:
    prep = data(messy_csv).preprocessor
    with pytest.raises(UserInputError, match=r"the rows, column 'label', row 1 holds the label 'huge'"):
        prep.encode_labels(pd.Series(["low", "huge"], name="label"), Location("the rows"))


@pytest.mark.parametrize("many", ["other", "target"])
def test_the_fitted_state_is_plain_data(messy_csv: Path, tmp_path: Path, many: str) -> None:
    prep = data(messy_csv, missing_indicator=True, high_cardinality=many).preprocessor
    torch.save(prep.state_dict(), tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)  # no pickled objects
    assert Preprocessor.from_state(loaded) == prep


def test_a_missing_category_cell_is_a_category_of_its_own(messy_csv: Path) -> None:
    prep = data(messy_csv, max_categories=50).preprocessor
    region = next(c for c in prep.categorical if c.name == "region")
    assert region.categories == sorted([MISSING, "east", "north", "south", "west"])
    x = prep.transform(messy_frame().iloc[[0, 1]], Location("rows"))  # row 0 has no region
    assert x[0, prep.feature_names.index(f"region={MISSING}")] == 1.0
    assert x[1, prep.feature_names.index(f"region={MISSING}")] == 0.0


def test_parquet_reads_the_same_as_the_csv(messy_csv: Path) -> None:
    parquet = messy_csv.with_suffix(".parquet")
    pd.read_csv(messy_csv).to_parquet(parquet)
    from_csv, from_parquet = data(messy_csv), data(parquet)
    assert from_parquet.source == "parquet"
    assert from_parquet.preprocessor == from_csv.preprocessor
    for stage in ("train", "val", "test"):
        for a, b in zip(from_csv.dataset(stage).tensors, from_parquet.dataset(stage).tensors, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_numeric_sources_keep_their_standardization() -> None:
    dm = TabularDataModule(source="digits")
    x = dm.dataset("train").tensors[0]
    train = dm.table.features.iloc[dm.split_rows["train"]].to_numpy(np.float64)
    scale = train.std(0)
    expected = (train - train.mean(0)) / np.where(scale == 0, 1.0, scale)
    torch.testing.assert_close(x, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-5)
    assert dm.in_features == 64


def test_a_semicolon_separated_file_reads_as_the_comma_separated_one(messy_csv: Path) -> None:
    semicolons = messy_csv.with_name("semicolons.csv")
    pd.read_csv(messy_csv).to_csv(semicolons, sep=";", index=False)
    assert data(semicolons).preprocessor == data(messy_csv).preprocessor


def test_identifier_like_columns_are_capped_or_left_out(tmp_path: Path, caplog) -> None:
    frame = messy_frame().assign(
        customer=[f"id-{k % 150}" for k in range(200)],  # mostly unique: capped, with a notice
        name=[f"person {k}" for k in range(200)],  # unique in every row: it can only memorize rows
    )
    frame.to_csv(tmp_path / "ids.csv", index=False)
    with caplog.at_level(logging.INFO):
        prep = data(tmp_path / "ids.csv", max_categories=10).preprocessor
    customer = next(c for c in prep.categorical if c.name == "customer")
    assert len(customer.categories) == 9
    assert customer.other
    assert "Column 'customer' has " in caplog.text
    assert "like an identifier" in caplog.text
    assert "(data.encoding.max_categories=10; data.encoding.high_cardinality: target reads" in caplog.text
    assert "name" not in prep.columns
    assert "the column(s) ['name'] hold a different text in every training row" in caplog.text


def test_parquet_is_read_a_block_of_columns_at_a_time_as_pandas_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = messy_frame().rename(columns={"income": " income "})  # a name with spaces around it
    frame["region"] = frame["region"].astype("category")
    frame["count"] = np.arange(len(frame))
    frame.index = pd.Index(np.arange(len(frame))[::-1], name="id")  # a saved index, dropped on reading
    path = tmp_path / "typed.parquet"
    frame.assign(age=frame["age"].astype(str)).to_parquet(path)
    reads = []
    read = pq.ParquetFile.read
    monkeypatch.setattr(pq.ParquetFile, "read", lambda self, **kw: reads.append(kw) or read(self, **kw))
    monkeypatch.setattr(sources, "READ_BLOCK_BYTES", 1)  # one column per read
    got = sources.read_file(path, "parquet")
    assert len(reads) == len(frame.columns)
    expected = pd.read_parquet(path).reset_index(drop=True)
    expected.columns = [name.strip() for name in expected.columns]
    pd.testing.assert_frame_equal(got, expected)


def test_parquet_tensors_are_encoded_from_the_file_read_again_with_the_table_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = messy_frame(300).rename(columns={"age": " age"})
    frame.loc[[3, 50, 120], "label"] = None  # rows without a target: positions in the file shift
    path = tmp_path / "messy.parquet"
    frame.assign(**{" age": frame[" age"].astype(str)}).to_parquet(path)
    monkeypatch.setattr(sources, "READ_BLOCK_BYTES", 8 * 300 * 2)  # two columns per read
    options = {"missing_indicator": True, "columns": Columns(na_values=["?"])}
    dm, reference = data(path, **options), data(path, **options)
    expected = {
        stage: (
            reference.preprocessor.transform(reference.table.features, reference.table.location, rows),
            reference._targets(rows),
        )
        for stage, rows in reference.split_rows.items()
    }
    weights = dm.class_weights()
    table = weakref.ref(dm.table.features)
    reads = []
    read_file = sources.read_file
    monkeypatch.setattr(sources, "read_file", lambda *a, **k: reads.append(a) or read_file(*a, **k))
    tensors = {stage: dm.dataset(stage).tensors for stage in ("train", "val", "test")}
    assert "table" not in dm.__dict__  # let go of
    assert table() is None  # and freed
    assert reads == []  # the columns came from ParquetColumns, not a second table
    for stage, (x, y) in tensors.items():
        torch.testing.assert_close(x, torch.from_numpy(expected[stage][0]), rtol=0, atol=0)
        torch.testing.assert_close(y, torch.from_numpy(expected[stage][1]), rtol=0, atol=0)
    torch.testing.assert_close(dm.class_weights(), weights)  # from the tensors: the file is not read again
    assert reads == []
    pd.testing.assert_frame_equal(dm.table.features, reference.table.features)  # asked for: read again
    assert len(reads) == 1


@pytest.mark.parametrize("when", ["before the tensors", "after the tensors"])
@pytest.mark.parametrize("how", ["rewritten", "removed"])
def test_a_parquet_file_changed_before_it_is_read_again_is_named(tmp_path: Path, when: str, how: str) -> None:
    path = tmp_path / "messy.parquet"
    write_parquet = partial(pd.DataFrame.to_parquet, path=path)
    write_parquet(messy_frame().assign(age=lambda f: f["age"].astype(str)))
    dm = data(path)
    assert dm.in_features > 0  # read and fitted
    if when == "after the tensors":
        dm.dataset("train")  # the table is let go of; asked for again, it is read again
    if how == "removed":
        path.unlink()
    else:  # the same rows in another order: the splits' positions would pick other rows
        write_parquet(
            messy_frame().sample(frac=1.0, random_state=0).assign(age=lambda f: f["age"].astype(str))
        )
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a write within the clock's tick
    with pytest.raises(
        UserInputError, match=r"Parquet file '.*messy.parquet' changed or went away after the"
    ):
        dm.dataset("train") if when == "before the tensors" else dm.table


def test_parquet_columns_named_like_a_saved_index_or_a_nested_field_are_read_again_as_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {"x": rng.normal(size=150), "id ": rng.normal(size=150), "label": rng.choice(["p", "q"], 150)},
        index=pd.Index(rng.permutation(1500)[:150], name="id"),  # "id" once the column's spaces go
    )
    frame.to_parquet(tmp_path / "index.parquet")
    # a struct "s" with a field "u", beside a column named "s.u": the path and the name coincide
    table = pa.table(
        {
            "s": pa.array([{"u": float(i), "v": -float(i)} for i in range(150)]),
            "s.u": pa.array(rng.normal(size=150)),
            "label": pa.array(rng.choice(["p", "q"], 150)),
        }
    )
    pq.write_table(table, tmp_path / "nested.parquet")
    for name, options in (("index.parquet", {}), ("nested.parquet", {"columns": Columns(drop=["s"])})):
        dm, reference = data(tmp_path / name, **options), data(tmp_path / name, **options)
        for stage in ("train", "val", "test"):
            rows = reference.split_rows[stage]
            expected = reference.preprocessor.transform(
                reference.table.features, reference.table.location, rows
            )
            torch.testing.assert_close(
                dm.dataset(stage).tensors[0], torch.from_numpy(expected), rtol=0, atol=0
            )
    with pytest.raises(UserInputError, match=r"column 's' holds nested values \(lists or records\)"):
        data(tmp_path / "nested.parquet").table  # noqa: B018
    monkeypatch.setattr(sources, "READ_BLOCK_BYTES", 1)  # "s" and "s.u" in reads of their own
    read = sources.read_file(tmp_path / "nested.parquet", "parquet")
    assert read["s"].iloc[3] == {"u": 3.0, "v": -3.0}  # whole, not the field "s.u" brought along
    np.testing.assert_array_equal(read["s.u"].to_numpy(), table["s.u"].to_numpy())


def test_a_parquet_file_without_a_column_the_preprocessing_reads_is_named(tmp_path: Path) -> None:
    path = tmp_path / "messy.parquet"
    messy_frame().assign(age=lambda f: f["age"].astype(str)).to_parquet(path)
    dm = data(path)
    fitted = dm.preprocessor
    # as from a checkpoint (data.preprocessing_from) fitted on a file that had one more column
    extra = preprocessing.NumericColumn("weight", fill=0.0, mean=0.0, scale=1.0, indicator=False)
    dm.__dict__["preprocessor"] = dataclasses.replace(fitted, numeric=[*fitted.numeric, extra])
    with pytest.raises(
        UserInputError, match=r"messy.parquet' has no column\(s\) \['weight'\], which the model"
    ):
        dm.dataset("train")
