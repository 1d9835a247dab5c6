"""``python -m src.apps.sweep``: see :mod:`src.apps.sweep`."""

import sys

from src.apps.sweep import cli_main

cli_main(sys.argv[1:])
