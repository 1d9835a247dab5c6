"""``python -m src.apps.generate``: see :mod:`src.apps.generate`."""

from src.apps.generate import main

main()
