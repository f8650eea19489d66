"""Paths into plain data (the dicts, lists and leaves of JSON and msgpack messages): the
structure-aware fuzzers of the files nnapi reads back and of the driver service's messages
pick a node by its path and replace it."""

from __future__ import annotations

from typing import Any


def paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    """Every node's path (keys / indexes from the root), the root's () first."""
    found = [prefix]
    if isinstance(tree, dict):
        for key, value in tree.items():
            found += paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            found += paths(value, (*prefix, index))
    return found


def get(tree: Any, path: tuple) -> Any:
    """The node at ``path``."""
    for key in path:
        tree = tree[key]
    return tree


def replace(tree: Any, path: tuple, value: Any) -> Any:
    """``tree`` with the node at ``path`` replaced by ``value`` (in place; the new root when
    ``path`` is the root's)."""
    if not path:
        return value
    get(tree, path[:-1])[path[-1]] = value
    return tree
