"""Project and group memory values (seed 003 §4.2): pure normalization, no I/O.

Memory is durable user-authored context, one value per project path
(``kv(projectMemory, <canonical path>)``) or per project group
(``kv(projectGroupMemory, <group id>)``). What is stored is always the
structured form::

    {"format": "entries-v1",
     "entries": [{"id": "e1", "title": "Build", "content": "make -j4"}, ...],
     "content": "## Build\\n\\nmake -j4",          # derived: what the runtime loads
     "updatedAt": 1785056400000}

* A write may send plain text (one untitled entry) or ``{format: "entries-v1",
  entries: [...]}``; titles and contents are trimmed, blank entries dropped,
  missing ids numbered ``e1``, ``e2``... by position, and ``content`` is always
  re-derived (a client's ``content`` is ignored).
* The derived content is capped at 32 KiB of UTF-8 (``PAYLOAD_TOO_LARGE``).
* Memory with no entries left stores no key (:data:`EMPTY`).
* A legacy plain-text value (written by an older build) reads back as one
  untitled entry.
* A stored value of another shape (entries that no longer validate, not an
  object or text) is damaged: :func:`memory_view` raises ``DamagedRecord``
  (CORRUPT_DATA), never an empty memory a reader (or an editor saving it back)
  would take for the real one.
"""

from __future__ import annotations

import re
from typing import Any, Final

from store.errors import DamagedRecord, InvalidInput, PayloadTooLarge, damaged_setting
from store.rules import MAX_MEMORY_BYTES, MAX_MEMORY_ENTRIES

__all__ = ["EMPTY", "FORMAT", "derive_content", "normalize_memory", "memory_view"]

FORMAT: Final = "entries-v1"
MAX_TITLE_CHARS: Final = 200
_ENTRY_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class _Empty:
    def __repr__(self) -> str:
        return "EMPTY"


EMPTY: Final = _Empty()
"""The normalized memory holds nothing: store no key."""


def derive_content(entries: list[dict[str, str]]) -> str:
    parts = [f"## {e['title']}\n\n{e['content']}" if e["title"] else e["content"] for e in entries]
    return "\n\n".join(p.strip() for p in parts if p.strip())


def _bad(field: str, reason: str) -> InvalidInput:
    return InvalidInput(f"{field}: {reason}", data={"field": field})


def _entries(raw: Any, field: str) -> list[dict[str, str]]:
    if not isinstance(raw, list):
        raise _bad(f"{field}.entries", "must be a list of {id?, title?, content}")
    if len(raw) > MAX_MEMORY_ENTRIES:
        raise _bad(f"{field}.entries", f"at most {MAX_MEMORY_ENTRIES} entries")
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"{field}.entries.{i}"
        if not isinstance(item, dict) or set(item) - {"id", "title", "content"}:
            raise _bad(where, "must be an object with id?, title? and content")
        title, content, eid = item.get("title", ""), item.get("content", ""), item.get("id")
        if not isinstance(title, str) or not isinstance(content, str):
            raise _bad(where, "title and content must be strings")
        title, content = title.strip(), content.strip()
        if len(title) > MAX_TITLE_CHARS or "\n" in title:
            raise _bad(f"{where}.title", f"one line of at most {MAX_TITLE_CHARS} characters")
        if eid is not None and (not isinstance(eid, str) or not _ENTRY_ID.fullmatch(eid)):
            raise _bad(f"{where}.id", "must match ^[A-Za-z0-9_.:-]{1,64}$")
        if not title and not content:
            continue
        out.append({"id": eid or "", "title": title, "content": content})
        if eid:
            if eid in seen:
                raise _bad(f"{where}.id", f"duplicate entry id {eid!r}")
            seen.add(eid)
    n = 0
    for entry in out:  # number the entries without an id, skipping ids already taken
        if not entry["id"]:
            n += 1
            while f"e{n}" in seen:
                n += 1
            entry["id"] = f"e{n}"
            seen.add(entry["id"])
    return out


def normalize_memory(value: Any, now_ms: int, *, field: str = "memory") -> dict[str, Any] | _Empty:
    """The stored form of a memory write, or :data:`EMPTY`; raises on a bad or oversized value."""
    if isinstance(value, str):
        entries = _entries([{"content": value}], field)
    elif isinstance(value, dict):
        extra = set(value) - {"format", "entries", "content", "updatedAt"}
        if extra or value.get("format", FORMAT) != FORMAT:
            raise _bad(field, f'must be text or {{"format": "{FORMAT}", "entries": [...]}}')
        entries = _entries(value.get("entries", []), field)
    else:
        raise _bad(field, f'must be text or {{"format": "{FORMAT}", "entries": [...]}}')
    if not entries:
        return EMPTY
    content = derive_content(entries)
    size = len(content.encode("utf-8"))
    if size > MAX_MEMORY_BYTES:
        raise PayloadTooLarge(f"{field}: {size} bytes of content, at most {MAX_MEMORY_BYTES}",
                              data={"field": field, "limit": MAX_MEMORY_BYTES})
    return {"format": FORMAT, "entries": entries, "content": content, "updatedAt": now_ms}


def memory_view(stored: Any, what: str = "memory", *, kv: tuple[str, str] | None = None) -> dict[str, Any]:
    """What a reader gets: the structured form (legacy text is one untitled entry; ``None``, no value stored, is
    the empty memory). A stored value the host did not write that way is ``DamagedRecord`` naming ``what``; with
    ``kv`` (the ``(ns, key)`` it was read from) its data names the record and its repair, as every damaged
    setting's does (``store.errors.damaged_setting``)."""

    def refuse(why: str) -> DamagedRecord:
        return damaged_setting(*kv, why, what) if kv is not None else DamagedRecord(f"{what} is unreadable: {why}")

    if stored is None:
        return {"format": FORMAT, "entries": [], "content": ""}
    if isinstance(stored, str):
        text = stored.strip()
        entries = [{"id": "legacy", "title": "", "content": text}] if text else []
        return {"format": FORMAT, "entries": entries, "content": text, "legacy": True}
    if isinstance(stored, dict) and isinstance(stored.get("entries"), list):
        try:
            entries = _entries(stored["entries"], "memory")
        except InvalidInput as exc:
            # entries of another writer's shape (an older build's "visual entries"): its derived plain content
            # is what the runtime was given, so that is what reads, as one untitled entry (seed 003 §2: entries
            # are normalized, legacy values stay readable); with no such content it cannot be read
            content = stored.get("content")
            if isinstance(content, str) and content.strip():
                text = content.strip()
                return {"format": FORMAT, "entries": [{"id": "legacy", "title": "", "content": text}],
                        "content": text, "legacy": True}
            raise refuse(str(exc)) from None
        view: dict[str, Any] = {"format": FORMAT, "entries": entries, "content": derive_content(entries)}
        if isinstance(stored.get("updatedAt"), int):
            view["updatedAt"] = stored["updatedAt"]
        return view
    raise refuse(f"a JSON {type(stored).__name__} that is neither memory nor text")
