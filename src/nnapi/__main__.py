"""``python -m nnapi``: the command line."""

from nnapi.cli import entry_point

entry_point()
