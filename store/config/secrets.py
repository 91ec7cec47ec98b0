"""Encrypted secret store: the ``file_fallback`` backend of seed 003 §4.12 / §10.

Values live only in ``secrets/<sha256(ref)>.sec`` files, AES-256-GCM encrypted
with a 32-byte machine key kept beside them in ``secrets/.machine-key``. SQLite
holds bookkeeping only (``secrets_meta``); a value never reaches the database.
A same-user process that can read the data directory can also decrypt the
secrets: that is the documented risk of this backend (seed §10.2).

File format (all integers big-endian)::

    MAGIC (8 bytes "PISEC03\\n") | version u32 | ref_len u16 | ref (UTF-8)
    | receipt (32) | written_at u64 | count u16 | count x earlier write (45)
    | nonce (12) | ciphertext + GCM tag (16)

``receipt`` names the request that wrote the file: a keyed MAC (machine key) of
its receipt key (clientId, submissionId, method, fingerprint), zeros for a write
without one; ``written_at`` is the time that write answered. A retry whose
receipt row a crash lost finds its own write there and answers its version
without writing again (:meth:`SecretStore.put`).

The earlier writes are the keyed writes of this ref before this one, newest
last, at most :data:`MAX_HISTORY`: ``mac (32) | op u8 | n u32 | at u64`` (op 1:
a ``set`` that answered version ``n``; op 2: a ``delete`` that answered
``deleted: n == 1``). They answer a retry whose receipt row went with a lost
database (the rows are rebuilt from files, and these methods' receipts were
in the database only): a ``set`` retried after the secret was set again (or
deleted) under another key is answered what it was answered, and does not put
its old value back. While a ref has no file (deleted, or never set) the same
list lives in ``<sha256(ref)>.receipts`` beside it: ``"PISECR1\\n" | count u16
| entries | HMAC-SHA256 (machine key) of ref and the rest`` (never a value; it
counts only while there is no ``.sec`` file: a delete writes it before the file
goes, and the next ``set`` carries its entries on). A key older than the newest
:data:`MAX_HISTORY` keyed writes of its ref is forgotten: after a database
loss its retry runs again.
Files of the earlier formats (``"PISEC01\\n"``: no receipt field;
``"PISEC02\\n"``: a receipt and nothing after it) are still read.

The AAD is ``"pi-secret/v3" NUL ref NUL`` and the whole header, magic to the
last earlier write (``"pi-secret/v2" NUL ref NUL version NUL receipt``, the
first format: ``"pi-secret/v1" NUL ref NUL version``), with ``ref`` taken from
the *request*, never from the file, so every header field, the nonce, the
ciphertext and the tag are authenticated: a flipped bit, a truncated file, a
file swapped with another ref's file (same key) or a wrong key all fail with
:class:`~store.errors.CorruptData` ("secret store corrupt/tampered"). A
tampered file is never overwritten or deleted: ``set``/``delete`` move it
aside to ``<name>.tampered-<ms>`` first and keep it for inspection.
Rollback to an older, genuine file of the *same* ref is not detectable (the
version is not recorded elsewhere); that is outside this backend's threat
model, like the key-beside-ciphertext risk.

A keyed delete (``delete(..., receipt=)``) first writes a trace named by the
same MAC (``<name>.deleting-<mac>``, temp + fsync + rename) holding only the
receipt record (:func:`store.receipts.file_record`, never a value), then removes
the file, before the row and the receipt commit: a retry whose receipt row a
crash lost finds the trace, removes the file if it is still there, and answers
``deleted: true``. A trace never holds a value, so a delete cut short with no
retry leaves the secret whole under its own name. The handler removes the
trace once the receipt is durable; boot removes one whose receipt row exists,
or whose file is still there (the delete never happened; its retry starts
again) (``secrets_meta_rebuild.sweep_delete_traces``).

Key file rules: created once with ``O_CREAT|O_EXCL`` (0600, ``fchmod`` since
the umask cannot be trusted), written to a temp name and hard-linked into
place so a crash never leaves a short key under the real name. A key file that
is not a regular file owned by this user, or has any group/other permission
bit, is **refused** (``CorruptData`` with ``reason: insecure_key_file``),
never silently fixed: a key that others could read may have leaked, and the
user should decide (``chmod 600`` it, or rotate the secrets).

A directory fsync that failed after a file was published or removed (the call answered ``IO_ERROR``)
is owed (:attr:`SecretStore.owed`): ``set``/``delete`` are refused (``IO_ERROR``) until the host restarts,
since their retry may find its effect in place and answer from it without writing (RELIABILITY rule 7).

Synchronous; callers run it in a worker thread and serialize writers.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets as _random
import sqlite3
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import orjson

from store.errors import CorruptData, InvalidInput, NotFound, PayloadTooLarge, classify_os_error
from store.faults import NO_FAULTS, Faults
from store.fsutil import TEMP_MARKER, OwedSyncs, atomic_write, fsync_dir, open_nofollow, remove_file_durable, write_all
from store.receipts import ReceiptKey, file_record

__all__ = [
    "BACKEND",
    "KEY_FILE",
    "MAGICS",
    "MAX_HISTORY",
    "MAX_REF_BYTES",
    "MAX_VALUE_BYTES",
    "DeleteOutcome",
    "SecretStore",
    "SetOutcome",
    "StoredSecret",
    "TAMPERED",
    "Written",
]

BACKEND = "file_fallback"
KEY_FILE = ".machine-key"
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
MAGIC = b"PISEC03\n"
MAGIC_V2 = b"PISEC02\n"
MAGIC_V1 = b"PISEC01\n"
MAGICS = (MAGIC, MAGIC_V2, MAGIC_V1)
RECEIPTS_MAGIC = b"PISECR1\n"
RECEIPT_BYTES = 32
NO_RECEIPT = bytes(RECEIPT_BYTES)
DELETING = ".deleting-"
RECEIPTS = ".receipts"
MAX_HISTORY = 64
SET, DELETE = 1, 2
MAX_REF_BYTES = 512
MAX_VALUE_BYTES = 64 * 1024
TAMPERED = "secret store corrupt/tampered"
_HEADER = struct.Struct(">IH")  # version, ref_len
_TAIL = struct.Struct(">QH")  # written_at, count of earlier writes (format 3)
_ENTRY = struct.Struct(">32sBIQ")  # mac, op, n, at


@dataclass(frozen=True)
class Written:
    """One keyed write of a ref and what it answered (see the module docstring)."""

    mac: bytes
    op: int
    """``SET`` (``n``: the version answered) or ``DELETE`` (``n``: 1 if it answered ``deleted: true``)."""
    n: int
    at: int
    """The time it answered (``updatedAt`` of a set; 0: not known)."""


@dataclass(frozen=True)
class StoredSecret:
    ref: str
    version: int
    value: str
    receipt: bytes = field(default=NO_RECEIPT, compare=False, repr=False)
    """The MAC of the receipt key of the write (``NO_RECEIPT``: none, or a first-format file)."""
    written_at: int = field(default=0, compare=False, repr=False)
    """When that write answered (0: a file of an earlier format)."""
    history: tuple[Written, ...] = field(default=(), compare=False, repr=False)
    """The keyed writes of this ref before this one, newest last."""


@dataclass(frozen=True)
class SetOutcome:
    """What a ``set`` answers: ``replayed`` says it found its own receipt key and wrote nothing - in the
    file on disk (``"own"``: its write is the current one) or among the earlier writes (``"earlier"``:
    the ref was written or deleted since, under another key)."""

    version: int
    updated_at: int
    replayed: Literal["own", "earlier"] | None = None


@dataclass(frozen=True)
class DeleteOutcome:
    """What a ``delete`` did: ``deleted`` whether it removed a file (a replay: what it answered the first
    time); ``replayed``: its receipt key was found among the ref's writes and nothing was done now;
    ``present``: a file of the ref is there (a later ``set``: a replay must leave the bookkeeping alone)."""

    deleted: bool
    replayed: bool = False
    present: bool = False


def _aad(ref: str, version: int, receipt: bytes | None) -> bytes:
    """``receipt`` None: a first-format file (format 2 only: format 3 authenticates its whole header)."""
    tail = b"" if receipt is None else b"\x00" + receipt
    label = b"pi-secret/v1" if receipt is None else b"pi-secret/v2"
    return label + b"\x00" + ref.encode("utf-8") + b"\x00" + str(version).encode("ascii") + tail


def _aad_v3(ref: str, header: bytes) -> bytes:
    return b"pi-secret/v3\x00" + ref.encode("utf-8") + b"\x00" + header


def _encode_entries(entries: tuple[Written, ...]) -> bytes:
    return b"".join(_ENTRY.pack(e.mac, e.op, e.n, e.at) for e in entries)


def _decode_entries(blob: bytes, start: int, count: int) -> tuple[Written, ...] | None:
    """``count`` entries from ``start`` (``None``: the blob is too short)."""
    if len(blob) < start + count * _ENTRY.size:
        return None
    return tuple(Written(*_ENTRY.unpack_from(blob, start + i * _ENTRY.size)) for i in range(count))


def validate_ref(ref: object) -> str:
    if not isinstance(ref, str) or not ref or len(ref.encode("utf-8")) > MAX_REF_BYTES:
        raise InvalidInput(f"secret ref must be 1-{MAX_REF_BYTES} bytes of text", data={"field": "ref"})
    if any(ord(ch) < 0x20 for ch in ref):
        raise InvalidInput("secret ref must not contain control characters", data={"field": "ref"})
    return ref


def encode_file(key: bytes, ref: str, version: int, value: str, *, receipt: bytes = NO_RECEIPT,
                written_at: int = 0, history: tuple[Written, ...] = (), nonce: bytes | None = None) -> bytes:
    """The file bytes for one secret (pure; ``nonce`` only for tests)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # not at import: see decode_file

    if len(receipt) != RECEIPT_BYTES:
        raise ValueError("receipt must be 32 bytes")
    if len(history) > MAX_HISTORY:
        raise ValueError(f"at most {MAX_HISTORY} earlier writes")
    nonce = nonce if nonce is not None else _random.token_bytes(NONCE_BYTES)
    ref_b = ref.encode("utf-8")
    header = (MAGIC + _HEADER.pack(version, len(ref_b)) + ref_b + receipt + _TAIL.pack(written_at, len(history))
              + _encode_entries(history))
    body = AESGCM(key).encrypt(nonce, value.encode("utf-8"), _aad_v3(ref, header))
    return header + nonce + body


def decode_file(key: bytes, ref: str, blob: bytes) -> StoredSecret:
    """Verify and decrypt; any mismatch raises ``CorruptData`` (never returns garbage)."""
    # cryptography is imported by the first secret read or write, not when the host boots (boot reads
    # only the files' headers): tests/host/test_boot_imports.py
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    def bad(reason: str) -> CorruptData:
        return CorruptData(f"{TAMPERED}: {reason} (ref {ref!r})", data={"ref": ref, "reason": reason})

    fixed = len(MAGIC) + _HEADER.size
    magic = blob[: len(MAGIC)]
    if len(blob) < fixed or magic not in MAGICS:
        raise bad("unknown or truncated header")
    version, ref_len = _HEADER.unpack_from(blob, len(MAGIC))
    ref_b = ref.encode("utf-8")
    end_ref = fixed + ref_len
    receipt = blob[end_ref : end_ref + RECEIPT_BYTES] if magic != MAGIC_V1 else None
    end_head = end_ref + (RECEIPT_BYTES if receipt is not None else 0)
    written_at = 0
    history: tuple[Written, ...] = ()
    if magic == MAGIC:
        if len(blob) < end_head + _TAIL.size:
            raise bad("truncated")
        written_at, count = _TAIL.unpack_from(blob, end_head)
        found = _decode_entries(blob, end_head + _TAIL.size, count) if count <= MAX_HISTORY else None
        if found is None:
            raise bad("truncated")
        history, end_head = found, end_head + _TAIL.size + count * _ENTRY.size
    if len(blob) < end_head + NONCE_BYTES + TAG_BYTES:
        raise bad("truncated")
    if blob[fixed:end_ref] != ref_b:
        raise bad("file belongs to another ref")
    nonce = blob[end_head : end_head + NONCE_BYTES]
    aad = _aad_v3(ref, blob[:end_head]) if magic == MAGIC else _aad(ref, version, receipt)
    try:
        plain = AESGCM(key).decrypt(nonce, blob[end_head + NONCE_BYTES :], aad)
    except InvalidTag:
        raise bad("authentication failed (tampered data or wrong key)") from None
    try:
        value = plain.decode("utf-8")
    except UnicodeDecodeError:  # pragma: no cover - authenticated bytes we wrote ourselves
        raise bad("value is not UTF-8") from None
    return StoredSecret(ref, version, value, NO_RECEIPT if receipt is None else receipt, written_at, history)


class SecretStore:
    """The ``secrets/`` directory: machine key + one encrypted file per ref."""

    def __init__(self, directory: str | os.PathLike[str], *, faults: Faults = NO_FAULTS,
                 owed: OwedSyncs | None = None) -> None:
        self.directory = Path(directory)
        self.faults = faults
        self.owed = owed if owed is not None else OwedSyncs()
        """A directory fsync that failed after a file was published or removed: :meth:`put` and
        :meth:`remove` are refused until the restart (a retry may find its effect there and write nothing)."""
        self._key: bytes | None = None

    # -- key ---------------------------------------------------------------
    @property
    def key_path(self) -> Path:
        return self.directory / KEY_FILE

    def key(self) -> bytes:
        """Load (or create once) the machine key; refuse an insecure key file.

        A key is created only while no secret exists: when ``.machine-key`` is gone
        but ciphertexts are there, minting a new key would silently make every one of
        them unreadable, so it is ``CORRUPT_DATA`` with a recovery hint instead.
        """
        if self._key is None:
            try:
                self._key = self._load_key()
            except FileNotFoundError:
                orphans = self._ciphertexts()
                if orphans:
                    raise CorruptData(
                        f"secret key file {self.key_path} is missing but {len(orphans)} encrypted secret(s) exist: "
                        "refusing to create a new key, which would make them unreadable. Restore .machine-key "
                        "from a backup; or, to give them up, move the secrets/*.sec files away and set the "
                        "secrets again", data={"reason": "missing_key", "secrets": len(orphans)}) from None
                self._create_key()
                self._key = self._load_key()
        return self._key

    def _ciphertexts(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.directory) if n.endswith(".sec") or ".sec.tampered-" in n)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise classify_os_error(exc, f"list {self.directory}") from exc

    def _load_key(self) -> bytes:
        path = self.key_path
        try:
            fd = open_nofollow(path, os.O_RDONLY)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise FileNotFoundError(str(path)) from None
            if exc.errno == errno.ELOOP:
                raise CorruptData(f"secret key file {path} is a symlink; refusing it",
                                  data={"reason": "insecure_key_file"}) from None
            raise classify_os_error(exc, f"open {path}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise CorruptData(f"secret key file {path} is not a regular file owned by this user; refusing it",
                                  data={"reason": "insecure_key_file"})
            if st.st_mode & 0o077:
                raise CorruptData(
                    f"secret key file {path} has mode {stat.S_IMODE(st.st_mode):04o}: group/other may read it; "
                    "refusing to use it (run chmod 600 on it, and rotate the secrets if it may have leaked)",
                    data={"reason": "insecure_key_file", "mode": f"{stat.S_IMODE(st.st_mode):04o}"},
                )
            data = os.read(fd, KEY_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) != KEY_BYTES:
            raise CorruptData(f"{TAMPERED}: key file {path} has {len(data)} bytes, expected {KEY_BYTES}",
                              data={"reason": "bad_key_file"})
        return data

    def _create_key(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.directory / f"{KEY_FILE}{TEMP_MARKER}{_random.token_hex(6)}"
        try:
            fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.fchmod(fd, 0o600)
                write_all(fd, _random.token_bytes(KEY_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, self.key_path)  # exclusive: never replaces a key another creator won
            except FileExistsError:
                pass
            os.unlink(tmp)
            fsync_dir(self.directory)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise classify_os_error(exc, f"create {self.key_path}") from exc

    # -- files -------------------------------------------------------------
    def path_for(self, ref: str) -> Path:
        return self.directory / (hashlib.sha256(validate_ref(ref).encode("utf-8")).hexdigest() + ".sec")

    def _read_blob(self, ref: str) -> bytes | None:
        return self._read_path(self.path_for(ref))

    def _read_path(self, path: Path) -> bytes | None:
        try:
            fd = open_nofollow(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise classify_os_error(exc, f"read secret {path.name}") from exc
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def get(self, ref: str) -> StoredSecret:
        blob = self._read_blob(ref)
        if blob is None:
            raise NotFound(f"secret {ref!r} not found", data={"ref": ref})
        return decode_file(self.key(), ref, blob)

    def exists(self, ref: str) -> bool:
        return self.path_for(ref).exists()

    def value_mac(self, value: str) -> str:
        """Keyed digest of a value: lets receipts tell two values apart without storing either."""
        return hmac.new(self.key(), b"receipt\x00" + value.encode("utf-8"), hashlib.sha256).hexdigest()

    def keyed_fingerprint(self, body: bytes) -> str:
        """Keyed digest of a request without its value (a receipt fingerprint nobody can test guesses against)."""
        return hmac.new(self.key(), b"receipt-request\x00" + body, hashlib.sha256).hexdigest()

    def receipt_mac(self, receipt: ReceiptKey) -> bytes:
        """Keyed digest of a receipt key: names the request that wrote (or deleted) a file, and only that."""
        body = orjson.dumps([receipt.client_id, receipt.submission_id, receipt.method, receipt.fingerprint])
        return hmac.new(self.key(), b"receipt-file\x00" + body, hashlib.sha256).digest()

    def _state(self, ref: str, now_ms: int) -> _State:
        """What is under ``ref`` now: its file's version (0 if none), the write that made it and the keyed
        writes before it (with no file: the ``.receipts`` record's); a tampered file is moved aside, kept."""
        path = self.path_for(ref)
        blob = self._read_path(path)
        if blob is None:
            return _State(present=False, version=0, own=None, history=self._read_receipts(ref))
        try:
            stored = decode_file(self.key(), ref, blob)
        except CorruptData:
            self._set_aside(path, now_ms)
            version = _HEADER.unpack_from(blob, len(MAGIC))[0] if len(blob) >= len(MAGIC) + _HEADER.size else 0
            return _State(present=False, version=version, own=None, history=(), aside=True)
        own = None
        if stored.receipt != NO_RECEIPT:
            at = stored.written_at or self._mtime_ms(path)
            own = Written(stored.receipt, SET, stored.version, at)
        return _State(present=True, version=stored.version, own=own, history=stored.history)

    @staticmethod
    def _mtime_ms(path: Path) -> int:
        try:
            return os.stat(path, follow_symlinks=False).st_mtime_ns // 1_000_000
        except OSError:
            return 0

    # -- the .receipts record of a ref without a file ------------------------
    def receipts_path(self, ref: str) -> Path:
        return self.path_for(ref).with_suffix(RECEIPTS)

    def _receipts_mac(self, ref: str, body: bytes) -> bytes:
        return hmac.new(self.key(), b"receipts\x00" + ref.encode("utf-8") + b"\x00" + body, hashlib.sha256).digest()

    def _read_receipts(self, ref: str) -> tuple[Written, ...]:
        """The keyed writes recorded for ``ref`` while it has no file; one that does not verify (damaged,
        another ref's, another key's) counts as none."""
        blob = self._read_path(self.receipts_path(ref))
        head = len(RECEIPTS_MAGIC) + 2
        if blob is None or len(blob) < head + RECEIPT_BYTES or not blob.startswith(RECEIPTS_MAGIC):
            return ()
        body, mac = blob[:-RECEIPT_BYTES], blob[-RECEIPT_BYTES:]
        if not hmac.compare_digest(mac, self._receipts_mac(ref, body)):
            return ()
        count = int.from_bytes(body[len(RECEIPTS_MAGIC):head], "big")
        if len(body) != head + count * _ENTRY.size:
            return ()
        return _decode_entries(body, head, count) or ()

    def _write_receipts(self, ref: str, entries: tuple[Written, ...]) -> None:
        """Record ``entries`` for ``ref`` (or drop a stale record when there are none): a delete does it
        before the file goes, so the writes it carried outlive it."""
        entries = entries[-MAX_HISTORY:]
        if not entries:
            remove_file_durable(self.receipts_path(ref), owed=self.owed)
            return
        body = RECEIPTS_MAGIC + len(entries).to_bytes(2, "big") + _encode_entries(entries)
        atomic_write(self.receipts_path(ref), body + self._receipts_mac(ref, body), faults=self.faults,
                     point_prefix="secrets.receipts", owed=self.owed)

    def _set_aside(self, src: Path, now_ms: int, *, keep_link: bool = False) -> Path:
        """Move (or, ``keep_link``, hard-link) a tampered file to ``<ref's name>.tampered-...``."""
        name = src.name.split(DELETING, 1)[0]
        dst = src.with_name(f"{name}.tampered-{now_ms}-{_random.token_hex(3)}")
        try:
            (os.link if keep_link else os.rename)(src, dst)
            fsync_dir(self.directory)
        except OSError as exc:
            raise classify_os_error(exc, f"set aside tampered secret {src.name}") from exc
        return dst

    def raw(self, ref: str) -> bytes | None:
        """``ref``'s file as it is now (``None``: none), for :meth:`put_back`."""
        return self._read_blob(validate_ref(ref))

    def put_back(self, ref: str, before: bytes | None) -> None:
        """Take back a write of ``ref`` whose call failed before its row committed: the file becomes
        ``before`` again (what :meth:`raw` read before the write; ``None``: removed)."""
        if self._read_blob(validate_ref(ref)) == before:
            return
        if before is None:
            remove_file_durable(self.path_for(ref), owed=self.owed)
        else:
            atomic_write(self.path_for(ref), before, faults=self.faults, point_prefix="secrets.put_back",
                         owed=self.owed)

    def set(self, ref: str, value: str, *, now_ms: int, receipt: ReceiptKey | None = None) -> int:
        """Encrypt and atomically (re)write ``ref``; returns the version answered (:meth:`put`)."""
        return self.put(ref, value, now_ms=now_ms, receipt=receipt).version

    def put(self, ref: str, value: str, *, now_ms: int, receipt: ReceiptKey | None = None) -> SetOutcome:
        """Encrypt and atomically (re)write ``ref``; returns the new version.

        With ``receipt``, the file records its MAC (and carries the earlier keyed writes on). When the
        file on disk already carries it, it is this request's own write from before a crash (its receipt
        row never committed); when one of the earlier writes does, the ref was written or deleted since
        under another key and this is a retry whose receipt row went with a lost database. Either way
        what it answered is answered and nothing is written (a replay does not write its value, README §4).
        """
        validate_ref(ref)
        if not isinstance(value, str):
            raise InvalidInput("secret value must be a string", data={"field": "value"})
        if len(value.encode("utf-8")) > MAX_VALUE_BYTES:
            raise PayloadTooLarge(f"secret value is larger than {MAX_VALUE_BYTES} bytes", data={"field": "value"})
        key = self.key()
        self.owed.pay()  # a replay below answers what an earlier write left in place: never on an owed fsync
        mac = self.receipt_mac(receipt) if receipt is not None else NO_RECEIPT
        state = self._state(ref, now_ms)
        if receipt is not None:
            if state.own is not None and hmac.compare_digest(state.own.mac, mac):
                return SetOutcome(state.own.n, state.own.at or now_ms, "own")
            earlier = _find(state.history, mac, SET)
            if earlier is not None:
                return SetOutcome(earlier.n, earlier.at or now_ms, "earlier")
        version = (state.version % 0xFFFFFFFF) + 1
        history = (state.history + ((state.own,) if state.own is not None else ()))[-MAX_HISTORY:]
        atomic_write(self.path_for(ref), encode_file(key, ref, version, value, receipt=mac, written_at=now_ms,
                                                     history=history),
                     faults=self.faults, point_prefix="secrets.write", owed=self.owed)
        return SetOutcome(version, now_ms)

    def delete(self, ref: str, *, now_ms: int, receipt: ReceiptKey | None = None) -> bool:
        """Remove ``ref``'s file (durably); whether there was one (:meth:`remove`)."""
        return self.remove(ref, now_ms=now_ms, receipt=receipt).deleted

    def remove(self, ref: str, *, now_ms: int, receipt: ReceiptKey | None = None,
               listed: bool = False) -> DeleteOutcome:
        """Remove ``ref``'s file (durably). A tampered file is moved aside, not destroyed.

        The keyed writes the file carried are recorded beside it first (``.receipts``, no value), with
        this request's own (it answers ``deleted: true`` if a file went or ``listed``, the ref's
        bookkeeping row, is there): a retry of any of them after a database loss is answered from it.
        With ``receipt``, this request's trace (its receipt record, never a value: see the module
        docstring) is made durable next, then the file goes: a trace found already is this request's
        delete from before a crash, finished now and answered ``True``. :meth:`forget_delete` removes it
        once the receipt row is durable. A request found among the ref's writes (the file's, or the
        record's while there is no file) is a replay: what it answered is answered, nothing is done.
        """
        path = self.path_for(ref)
        self.owed.pay()  # a replay below answers what an earlier delete left in place: never on an owed fsync
        state = self._state(ref, now_ms)
        carried = state.history + ((state.own,) if state.own is not None else ())
        if receipt is None:
            if state.present:
                self._write_receipts(ref, carried)
                remove_file_durable(path, owed=self.owed)
            return DeleteOutcome(state.present or state.aside)
        mac = self.receipt_mac(receipt)
        earlier = _find(state.history, mac, DELETE)
        if earlier is not None:
            return DeleteOutcome(earlier.n == 1, replayed=True, present=state.present)
        trace = self._trace(ref, receipt)
        if os.path.lexists(trace):
            remove_file_durable(path, owed=self.owed)
            return DeleteOutcome(True)
        gone = state.present or state.aside
        self._write_receipts(ref, carried + (Written(mac, DELETE, int(gone or listed), now_ms),))
        if not gone:
            return DeleteOutcome(False)
        atomic_write(trace, orjson.dumps(file_record(receipt)), faults=self.faults, point_prefix="secrets.trace",
                     owed=self.owed)
        self.faults.point("secrets.delete.after_aside")
        remove_file_durable(path, owed=self.owed)
        return DeleteOutcome(True)

    def forget_delete(self, ref: str, receipt: ReceiptKey) -> None:
        """Remove a keyed delete's trace once its receipt is durable (a leftover one: boot removes it)."""
        try:
            os.unlink(self._trace(ref, receipt))
        except OSError:
            pass

    def _trace(self, ref: str, receipt: ReceiptKey) -> Path:
        path = self.path_for(ref)
        return path.with_name(f"{path.name}{DELETING}{self.receipt_mac(receipt).hex()}")



@dataclass(frozen=True)
class _State:
    present: bool
    version: int
    own: Written | None
    history: tuple[Written, ...]
    aside: bool = False
    """A tampered file was there and is moved aside now."""


def _find(history: tuple[Written, ...], mac: bytes, op: int) -> Written | None:
    for entry in reversed(history):
        if entry.op == op and hmac.compare_digest(entry.mac, mac):
            return entry
    return None


# -- secrets_meta (bookkeeping only; never a value) ------------------------


def upsert_meta(conn: sqlite3.Connection, ref: str, *, owner_kind: str | None, owner_id: str | None,
                kind: str | None, now_ms: int) -> dict[str, object]:
    conn.execute(
        "INSERT INTO secrets_meta(secret_ref, owner_kind, owner_id, kind, backend, updated_at) "
        "VALUES (?, COALESCE(?, 'provider'), ?, COALESCE(?, 'api_key'), ?, ?) "
        "ON CONFLICT(secret_ref) DO UPDATE SET owner_kind = COALESCE(?, owner_kind), "
        "owner_id = COALESCE(?, owner_id), kind = COALESCE(?, kind), backend = excluded.backend, "
        "updated_at = excluded.updated_at",
        (ref, owner_kind, owner_id, kind, BACKEND, now_ms, owner_kind, owner_id, kind),
    )
    found = get_meta(conn, ref)
    assert found is not None
    return found


def get_meta(conn: sqlite3.Connection, ref: str) -> dict[str, object] | None:
    row = conn.execute(
        "SELECT secret_ref, owner_kind, owner_id, kind, backend, updated_at FROM secrets_meta "
        "WHERE secret_ref = ?", (ref,)).fetchone()
    return _meta(row) if row else None


def delete_meta(conn: sqlite3.Connection, ref: str) -> bool:
    return conn.execute("DELETE FROM secrets_meta WHERE secret_ref = ?", (ref,)).rowcount > 0


def list_meta(conn: sqlite3.Connection, *, owner_kind: str | None = None,
              owner_id: str | None = None) -> list[dict[str, object]]:
    where, args = [], []
    if owner_kind is not None:
        where.append("owner_kind = ?")
        args.append(owner_kind)
    if owner_id is not None:
        where.append("owner_id = ?")
        args.append(owner_id)
    sql = "SELECT secret_ref, owner_kind, owner_id, kind, backend, updated_at FROM secrets_meta"
    if where:
        sql += " WHERE " + " AND ".join(where)
    return [_meta(r) for r in conn.execute(sql + " ORDER BY secret_ref", args)]


def _meta(row: tuple[object, ...]) -> dict[str, object]:
    ref, owner_kind, owner_id, kind, backend, updated_at = row
    out: dict[str, object] = {"ref": ref, "ownerKind": owner_kind, "kind": kind, "backend": backend,
                              "updatedAt": updated_at}
    if owner_id is not None:
        out["ownerId"] = owner_id
    return out
