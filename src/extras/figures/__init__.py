"""Validation figures: a confusion matrix (classification) or predicted against true values (regression),
drawn by a worker process; the callback is :class:`src.extras.figures.callback.ValidationFigures`.

This file imports nothing, so that the worker that imports :mod:`src.extras.figures.drawing` by name
imports matplotlib and numpy only, never Lightning.
"""
