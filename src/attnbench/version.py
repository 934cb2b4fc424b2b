"""attnbench's version, in a module of its own: the modules that record it need not import the package."""

__version__ = "0.1.0"
