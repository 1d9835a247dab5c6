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


def process_group_error(err: BaseException) -> BaseException | None:
    """The error in ``err``'s chain that says the processes of a distributed run never met or lost one
    another: torch's ``DistError`` (a taken port, a timeout), or gloo's ``RuntimeError`` (a peer gone)."""
    import torch.distributed as dist

    cause: BaseException | None = err
    while cause is not None:
        if dist.is_available() and isinstance(cause, dist.DistError):
            return cause
        # DDP's own collectives (the buffers' broadcast, the gradients' all-reduce) raise gloo's errors as
        # they come: "[.../gloo/transport/tcp/pair.cc:537] Read error ...: Connection reset by peer"
        if isinstance(cause, RuntimeError) and "/gloo/" in str(cause).split("]", 1)[0]:
            return cause
        cause = cause.__cause__ or cause.__context__
    return None
