"""A Lightning project template for supervised learning: ``python -m src.cli fit -c configs/digits.yaml``."""


def console() -> None:
    """The CLI on the shell's words: the ``lightning-template`` command (pyproject.toml's script)."""
    from src.cli import main
    from src.cli_errors import as_command

    as_command(main)
