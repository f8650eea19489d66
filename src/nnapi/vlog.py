"""Verbose logging by tag, after Android's ``debug.nn.vlog``.

The runtime and drivers log through Python's :mod:`logging` under ``nnapi.<tag>``; the
tags are Android's: ``compilation``, ``cpuexe``, ``driver``, ``execution``, ``manager``,
``model``. ``NNAPI_VLOG=all`` (or a comma- or space-separated tag list, as
``debug.nn.vlog`` takes) turns them on at DEBUG level, written to stderr. Applications
that configure logging themselves can enable the same loggers by name instead.
"""

from __future__ import annotations

import logging
import os
import sys

TAGS = ("compilation", "cpuexe", "driver", "execution", "manager", "model")

_configured: set[str] = set()


def logger(tag: str) -> logging.Logger:
    """The logger of one vlog tag (``nnapi.<tag>``)."""
    if tag not in TAGS:
        raise ValueError(f"unknown vlog tag {tag!r} (tags: {', '.join(TAGS)})")
    return logging.getLogger(f"nnapi.{tag}")


def parse_tags(spec: str) -> list[str]:
    """The tags named by an ``NNAPI_VLOG`` value; ``all`` or ``1`` means every tag.

    Unknown tags are ignored, as Android ignores them."""
    words = [word for word in spec.replace(",", " ").replace(":", " ").split() if word]
    if any(word in ("all", "1") for word in words):
        return list(TAGS)
    return [word for word in words if word in TAGS]


def enable(tags: list[str] | str = "all", stream=None) -> list[str]:
    """Turn on DEBUG logging for ``tags`` (a list or an NNAPI_VLOG-style string),
    with one stderr handler per logger; returns the tags enabled."""
    chosen = parse_tags(tags) if isinstance(tags, str) else [t for t in tags if t in TAGS]
    for tag in chosen:
        log = logger(tag)
        log.setLevel(logging.DEBUG)
        if tag not in _configured:
            handler = logging.StreamHandler(stream or sys.stderr)
            handler.setFormatter(logging.Formatter("nnapi %(name)s: %(message)s"))
            log.addHandler(handler)
            _configured.add(tag)
    return chosen


def enable_from_environment() -> None:
    spec = os.environ.get("NNAPI_VLOG", "")
    if spec:
        enable(spec)


compilation = logger("compilation")
cpuexe = logger("cpuexe")
driver = logger("driver")
execution = logger("execution")
manager = logger("manager")
model = logger("model")
