"""Break the summary on purpose: the proofs that hold it must fail."""

from pathlib import Path

import pytest

import src.extras.summary
import src.extras.summary.test_summary as summary
from tests.test_mutations import mutate


def test_the_table_test_catches_a_reference_put_in_the_nets_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A baseline's val/acc_hgb without the net's val/acc, shown as if it were the net's own value."""
    mutate(
        monkeypatch,
        src.extras.summary,
        "_table",
        "elif (stem := name[: -len(reference) - 1]) in named:",
        "elif (stem := name[: -len(reference) - 1]) in named or not own.setdefault(f'val/{name}', value):",
    )
    with pytest.raises(AssertionError):
        summary.test_a_reference_stands_only_beside_the_nets_value_of_the_same_name(tmp_path, capsys)


def test_the_viewer_test_catches_tensorboards_command_for_every_logger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TensorBoard line printed whatever the logger, as it was for a CSV logger's run."""
    mutate(
        monkeypatch,
        src.extras.summary,
        "viewers",
        "if isinstance(logger, TensorBoardLogger) and logger.log_dir:",
        "if logger.log_dir:",
    )
    with pytest.raises(AssertionError):
        summary.test_a_csv_logger_is_named_by_its_metrics_file_and_gets_no_tensorboard_line(tmp_path, capsys)
