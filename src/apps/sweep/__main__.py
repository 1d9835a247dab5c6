"""``python -m src.apps.sweep``: see :mod:`src.apps.sweep`."""

import sys

from src.apps.sweep import cli_main

words = sys.argv[1:]
# the words reach LightningCLI through main(args); left in sys.argv too, it warns of a clash
del sys.argv[1:]
cli_main(words)
