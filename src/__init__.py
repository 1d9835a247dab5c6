"""A Lightning project template for supervised learning.

Run it with ``python -m src.cli fit --config configs/digits.yaml``.
"""

import sys


def console() -> None:
    """The CLI on the shell's words: ``python -m src.cli`` and the ``lightning-template`` command
    (pyproject.toml's script). ``predict`` on a table's checkpoint is answered before Lightning is
    imported, whose import takes longer than the rest (src/fast_predict.py); anything else goes to the
    full CLI."""
    from src.fast_predict import main as predict_without_lightning

    if predict_without_lightning(sys.argv[1:]):
        return
    from src.cli import main

    main()
