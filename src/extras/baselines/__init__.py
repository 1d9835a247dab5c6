"""Baselines: gradient boosting and a linear model on the net's own rows, fitted in a process of their
own; the callback is :class:`src.extras.baselines.callback.Baselines`.

This file imports nothing, so that the worker that imports :mod:`src.extras.baselines.models` by name
imports scikit-learn only, never Lightning.
"""
