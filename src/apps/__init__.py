"""Apps on top of the training core, one folder each: each uses the core (``src.cli``, models, data,
callbacks, predict), and nothing in the core uses them.

An app's folder holds its code, its tests (``test_*.py``), its page (``README.md``), its make targets
(``app.mk``, which the Makefile includes) and its benchmark (``bench.py``, which ``make bench`` runs);
deleting the folder removes the app (the README's table of apps names each). ``tests/test_layout.py``
holds the core to knowing nothing of them and deletes each in a copy of the repository.
"""
