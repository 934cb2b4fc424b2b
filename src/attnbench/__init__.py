"""attnbench: benchmark, verify and compare attention kernels."""

__version__ = "0.1.0"
