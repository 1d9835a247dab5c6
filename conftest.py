"""The shared fixtures of ``tests/conftest.py`` for every test folder: ``tests/``, ``examples/``, and each
extra's and app's own tests in ``src/extras/<extra>/`` and ``src/apps/<app>/``, which go with their folder
when it is deleted."""

pytest_plugins = ["tests.conftest"]
