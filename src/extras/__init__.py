"""Extras: what a config switches on, each one folder (code, tests, page) that the core never imports.
Deleting one is ``rm -r src/extras/<name>`` plus its entries in ``configs/`` and its README row.

The modules beside the folders are what several extras share: the TensorBoard writer and the values
they read of a run (``loggers``), the figure painter (``painter``) and its worker processes
(``workers``), and the gradient norm taken once per step (``gradients``).
"""
