"""The one error type for bad user input: the CLI prints its message as one sentence and exits non-zero."""


class UserInputError(ValueError):
    """A file, column, key or value the user supplied is wrong; the message says which and what to do."""


def notice(message: str) -> None:
    """Tell the user something about their data (a column left out, cells read as missing), once per run
    (global rank 0), through Lightning's own rank-zero logger.

    Lightning is imported on the first notice, not with the modules that read data: the
    :class:`src.predict.Predictor` reads and encodes a table without it.
    """
    from lightning.pytorch.utilities import rank_zero_info

    rank_zero_info(message)
