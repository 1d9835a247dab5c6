"""``python -m src.apps.serve``: see :mod:`src.apps.serve`."""

from src.apps.serve import main

main()
