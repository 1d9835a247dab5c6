"""The one error type for bad user input: the CLI prints its message as one sentence and exits non-zero."""


class UserInputError(ValueError):
    """A file, column, key or value the user supplied is wrong; the message says which and what to do."""
