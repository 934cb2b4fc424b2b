"""Summary statistics of timing samples (milliseconds)."""

from __future__ import annotations

import numpy as np


def summarize(samples_ms) -> dict:
    """median, p10, p90, mean, std (sample), min, max and n of the samples, in ms."""
    x = np.asarray(list(samples_ms), dtype=np.float64)
    if x.size == 0:
        raise ValueError("no timing samples")
    return {
        "median_ms": float(np.median(x)),
        "p10_ms": float(np.percentile(x, 10)),
        "p90_ms": float(np.percentile(x, 90)),
        "mean_ms": float(x.mean()),
        "std_ms": float(x.std(ddof=1)) if x.size > 1 else 0.0,
        "min_ms": float(x.min()),
        "max_ms": float(x.max()),
        "n": int(x.size),
    }
