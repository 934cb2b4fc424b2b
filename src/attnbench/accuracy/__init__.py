"""Accuracy: exact reference (reference.py), the math baseline (baseline.py), error metrics
(compare.py), the verdict (tolerance.py) and the runner's checker (check.py)."""
