"""attnbench: benchmark, verify and compare attention kernels.

From Python (``docs/api.md``): ``attnbench.run(seq_lens=[256], backends=["naive"])`` returns the records of a run,
``attnbench.verify(...)`` those of a check, ``attnbench.plan(...)`` the validated run configuration and
``attnbench.frame(records)`` a pandas DataFrame. Importing the package imports nothing else (no torch).
"""

from attnbench.version import __version__

__all__ = ["__version__", "frame", "plan", "run", "verify"]
_API = ("frame", "plan", "run", "verify")


def __getattr__(name: str):
    if name in _API:
        from attnbench import api
        return getattr(api, name)
    raise AttributeError(f"module 'attnbench' has no attribute {name!r}")
