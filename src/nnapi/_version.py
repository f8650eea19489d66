"""The package version, in a module of its own so that drivers and the runtime can read it
without importing the package front door (``nnapi/__init__.py``)."""

__version__ = "0.1.0"
