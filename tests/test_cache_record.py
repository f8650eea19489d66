"""The drivers' private record of the compilation cache files they wrote
(drivers/cache_record.py)."""

from __future__ import annotations

import os
import stat
import time

import pytest

from nnapi.drivers import cache_record
from nnapi.hal import HalError

TOKEN = bytes(range(32))


@pytest.fixture
def records(tmp_path, monkeypatch):
    """A record directory of this test's own (not created yet)."""
    path = tmp_path / "records"
    monkeypatch.setenv(cache_record.ENVIRONMENT, str(path))
    return path


def _records_in(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(".rec"))


def test_a_record_binds_device_token_and_seal(records):
    """remember/holds: the record says what the device last wrote for that token and
    nothing else; it lives in a private directory (0700, files 0600), its key is 32
    random bytes, and a record names neither the token nor the seal."""
    assert not records.exists() and not cache_record.holds("dev", TOKEN, "seal-1")
    assert cache_record.remember("dev", TOKEN, "seal-1")
    assert cache_record.holds("dev", TOKEN, "seal-1")
    assert not cache_record.holds("dev", TOKEN, "seal-2")
    assert not cache_record.holds("other-dev", TOKEN, "seal-1")
    assert not cache_record.holds("dev", bytes(32), "seal-1")
    assert stat.S_IMODE(records.stat().st_mode) == 0o700
    key = (records / "key").read_bytes()
    assert len(key) == 32 and stat.S_IMODE((records / "key").stat().st_mode) == 0o600
    (name,) = _records_in(records)
    content = (records / name).read_bytes()
    assert len(content) == 64 and all(c in b"0123456789abcdef" for c in content)
    assert TOKEN.hex() not in name and b"seal-1" not in content
    cache_record.remember("dev", TOKEN, "seal-2")  # rewritten: only the last one holds
    assert cache_record.holds("dev", TOKEN, "seal-2") and not cache_record.holds("dev", TOKEN, "seal-1")
    assert _records_in(records) == [name] and (records / "key").read_bytes() == key
    with pytest.raises(HalError, match="dev has no record of writing it"):
        cache_record.require("dev", TOKEN, "seal-1")
    cache_record.require("dev", TOKEN, "seal-2")


def test_the_record_is_bounded_least_recently_used_first(records, monkeypatch):
    """Past MAX_RECORDS the least recently written or used records are deleted (a record
    used by a compilation from the cache counts as recent), and stale temporary files of a
    process that died mid-write with them."""
    monkeypatch.setattr(cache_record, "MAX_RECORDS", 3)
    tokens = [bytes([n]) * 32 for n in range(5)]
    for age, token in zip((50, 40, 30), tokens[:3]):  # (the clock's grain is coarser than a write)
        before = set(_records_in(records)) if records.exists() else set()
        cache_record.remember("dev", token, "s")
        (name,) = set(_records_in(records)) - before
        os.utime(records / name, (time.time() - age,) * 2)  # oldest first: token 0, 1, 2
    stale = records / ".123-abc.tmp"
    stale.write_bytes(b"x")
    os.utime(stale, (time.time() - 7200,) * 2)
    assert cache_record.holds("dev", tokens[0], "s")  # token 0 is used: now the newest
    cache_record.remember("dev", tokens[3], "s")
    assert len(_records_in(records)) == 3 and not stale.exists()
    assert [cache_record.holds("dev", t, "s") for t in tokens[:4]] == [True, False, True, True]
