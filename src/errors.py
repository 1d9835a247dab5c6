"""The one error type for bad user input: the CLI prints its message as one sentence and exits non-zero."""


class UserInputError(ValueError):
    """A file, column, key or value the user supplied is wrong; the message says which and what to do."""


def notice(message: str) -> None:
    """Tell the user something once per run (global rank 0); Lightning is imported on the first notice."""
    from lightning.pytorch.utilities import rank_zero_info

    rank_zero_info(message)


def process_group_error(err: BaseException) -> BaseException | None:
    """The error in ``err``'s chain saying a distributed run's processes never met or lost one another."""
    import torch.distributed as dist

    cause: BaseException | None = err
    while cause is not None:
        if dist.is_available() and isinstance(cause, dist.DistError):
            return cause
        # DDP's collectives raise gloo's errors as they come: "[.../gloo/transport/tcp/pair.cc:537] ..."
        if isinstance(cause, RuntimeError) and "/gloo/" in str(cause).split("]", 1)[0]:
            return cause
        cause = cause.__cause__ or cause.__context__
    return None
