"""The shared fixtures of ``tests/conftest.py`` for every test folder: ``tests/`` and each app's own tests
in ``src/apps/<app>/``, which go with the app's folder when it is deleted."""

pytest_plugins = ["tests.conftest"]
