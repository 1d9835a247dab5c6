"""Apps on top of the training core: each uses the core (``src.cli``, models, data, callbacks, predict),
and nothing in the core uses them.

- ``export``: a checkpoint as an ONNX or ``torch.export`` graph with its preprocessing (``make export``)
- ``serve``: a checkpoint behind HTTP (``make serve``)
- ``cv``: cross-validation and repeats over seeds (``make cv``, ``make repeat``)
- ``sweep``: Optuna sweeps, each trial a CLI run; it cross-validates through ``cv`` (``make sweep``)
- ``generate``: text from a language model's checkpoint: greedy, temperature, top-k, top-p (``make generate``)
- ``doctor``: checks of a model, data and schedule for the silent loop bugs (``make doctor``)

An app you do not need goes by deleting its module (or folder), its Makefile target, its test file and
its commands in ``docs/``; ``tests/test_layout.py`` holds the core to knowing nothing of them.
"""
