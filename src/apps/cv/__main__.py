"""``python -m src.apps.cv``: see :mod:`src.apps.cv`."""

import sys

from src.apps.cv import cli_main

cli_main(sys.argv[1:])
