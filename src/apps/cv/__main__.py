"""``python -m src.apps.cv``: see :mod:`src.apps.cv`."""

import sys

from src.apps.cv import cli_main

words = sys.argv[1:]
# the words reach LightningCLI through main(args); left in sys.argv too, it warns of a clash
del sys.argv[1:]
cli_main(words)
