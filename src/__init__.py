"""A Lightning project template for supervised learning.

Run it with ``python -m src.cli fit --config configs/digits.yaml``.
"""
