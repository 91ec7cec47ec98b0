"""The keyed writes a secret's file remembers (and, while the ref has no file, its ``.receipts`` record):
what answers a ``secrets.set`` / ``secrets.delete`` retried after a lost database (README §4,
``tests/integrity/test_secret_retry_after_db_loss.py`` end to end). In process, on the store."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from store.config import secrets as s
from store.errors import CorruptData
from store.faults import Faults, InjectedFault
from store.receipts import ReceiptKey

NOW = 1_785_056_400_000


def _key(sub: str, method: str = "secrets.set") -> ReceiptKey:
    return ReceiptKey("ui-1", sub, method, "e" * 64)


def test_a_retry_is_answered_from_the_earlier_writes_and_writes_nothing(tmp_path: Path) -> None:
    st = s.SecretStore(tmp_path / "secrets")
    assert st.put("r", "v1", now_ms=NOW, receipt=_key("a")) == s.SetOutcome(1, NOW)
    assert st.put("r", "v2", now_ms=NOW + 1, receipt=_key("b")) == s.SetOutcome(2, NOW + 1)
    assert st.put("r", "v3", now_ms=NOW + 2) == s.SetOutcome(3, NOW + 2)  # unkeyed: carries the keys on
    blob = st.path_for("r").read_bytes()
    assert st.put("r", "v1", now_ms=NOW + 9, receipt=_key("a")) == s.SetOutcome(1, NOW, "earlier")
    assert st.put("r", "v2", now_ms=NOW + 9, receipt=_key("b")) == s.SetOutcome(2, NOW + 1, "earlier")
    assert st.path_for("r").read_bytes() == blob
    assert st.put("r", "v4", now_ms=NOW + 3, receipt=_key("c")) == s.SetOutcome(4, NOW + 3)
    assert st.put("r", "v4", now_ms=NOW + 9, receipt=_key("c")) == s.SetOutcome(4, NOW + 3, "own")
    assert st.get("r").value == "v4"


def test_the_record_beside_a_deleted_secret_answers_its_sets_and_its_delete(tmp_path: Path) -> None:
    st = s.SecretStore(tmp_path / "secrets")
    st.put("r", "v1", now_ms=NOW, receipt=_key("a"))
    gone = _key("d", "secrets.delete")
    assert st.remove("r", now_ms=NOW + 1, receipt=gone) == s.DeleteOutcome(True)
    st.forget_delete("r", gone)
    record = st.receipts_path("r")
    assert stat.S_IMODE(os.stat(record).st_mode) == 0o600
    assert b"v1" not in record.read_bytes()  # MACs and answers only, never a value
    assert st.put("r", "v1", now_ms=NOW + 9, receipt=_key("a")) == s.SetOutcome(1, NOW, "earlier")
    assert not st.exists("r")
    assert st.remove("r", now_ms=NOW + 9, receipt=gone) == s.DeleteOutcome(True, replayed=True)
    # set again under another key: the file carries the record on; the old delete no longer removes it
    assert st.put("r", "v2", now_ms=NOW + 2, receipt=_key("b")) == s.SetOutcome(1, NOW + 2)
    assert st.remove("r", now_ms=NOW + 9, receipt=gone) == s.DeleteOutcome(True, replayed=True, present=True)
    assert st.put("r", "v1", now_ms=NOW + 9, receipt=_key("a")) == s.SetOutcome(1, NOW, "earlier")
    assert st.get("r").value == "v2"
    # a delete of nothing answers what it answered too (``listed``: the bookkeeping row was there)
    nothing = _key("n", "secrets.delete")
    assert st.remove("x", now_ms=NOW, receipt=nothing, listed=True) == s.DeleteOutcome(False)
    st.put("x", "later", now_ms=NOW + 1, receipt=_key("x"))
    assert st.remove("x", now_ms=NOW + 9, receipt=nothing) == s.DeleteOutcome(True, replayed=True, present=True)
    assert st.get("x").value == "later"


def test_a_delete_cut_after_its_record_but_before_the_file_went_is_done_by_its_retry(tmp_path: Path) -> None:
    """The record counts only while the ref has no file: written before the file goes, it says nothing
    about a delete that had not happened yet."""
    faults = Faults()
    faults.add("secrets.receipts.before_dirsync")
    st = s.SecretStore(tmp_path / "secrets", faults=faults)
    st.put("r", "v1", now_ms=NOW, receipt=_key("a"))
    gone = _key("d", "secrets.delete")
    with pytest.raises(InjectedFault):
        st.remove("r", now_ms=NOW + 1, receipt=gone)
    assert st.get("r").value == "v1" and st.receipts_path("r").exists()
    assert st.remove("r", now_ms=NOW + 2, receipt=gone) == s.DeleteOutcome(True)
    assert not st.exists("r")
    assert st.remove("r", now_ms=NOW + 3, receipt=gone) == s.DeleteOutcome(True, replayed=True)


def test_a_damaged_or_foreign_record_counts_as_none(tmp_path: Path) -> None:
    st = s.SecretStore(tmp_path / "secrets")
    for ref in ("r", "q"):
        st.put(ref, "v1", now_ms=NOW, receipt=_key("a"))
        st.remove(ref, now_ms=NOW, receipt=_key("d", "secrets.delete"))
    good = st.receipts_path("r").read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 1
    st.receipts_path("r").write_bytes(bytes(bad))
    assert st.put("r", "v1", now_ms=NOW + 1, receipt=_key("a")) == s.SetOutcome(1, NOW + 1)  # runs again
    st.remove("r", now_ms=NOW + 2)
    st.receipts_path("r").write_bytes(st.receipts_path("q").read_bytes())  # another ref's record
    assert st.put("r", "v1", now_ms=NOW + 3, receipt=_key("a")) == s.SetOutcome(1, NOW + 3)


def test_only_the_newest_writes_are_kept(tmp_path: Path) -> None:
    st = s.SecretStore(tmp_path / "secrets")
    for i in range(s.MAX_HISTORY + 2):
        st.put("r", f"v{i}", now_ms=NOW + i, receipt=_key(f"k{i}"))
    # the file's own write and MAX_HISTORY before it; the oldest one is forgotten and runs again
    assert st.put("r", "x", now_ms=NOW + 99, receipt=_key("k1")).replayed == "earlier"
    assert st.put("r", "x", now_ms=NOW + 99, receipt=_key("k0")) == s.SetOutcome(s.MAX_HISTORY + 3, NOW + 99)
    assert len(st.path_for("r").read_bytes()) < 4096


def test_every_bit_flip_of_a_file_with_earlier_writes_is_detected(tmp_path: Path) -> None:
    st = s.SecretStore(tmp_path / "secrets")
    for i in range(3):
        st.put("r", f"secret-{i}", now_ms=NOW + i, receipt=_key(f"k{i}"))
    path = st.path_for("r")
    good = path.read_bytes()
    for bit in range(len(good) * 8):
        bad = bytearray(good)
        bad[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(bad))
        with pytest.raises(CorruptData, match="secret store corrupt/tampered"):
            st.get("r")
    path.write_bytes(good)
    assert st.get("r").value == "secret-2"
