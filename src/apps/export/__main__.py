"""``python -m src.apps.export``: see :mod:`src.apps.export`."""

from src.apps.export import main

main()
