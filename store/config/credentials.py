"""Does this look like a credential? Names and value shapes (pure; used by the run-environment filter).

A run environment snapshot must hold credential *references*, never values
(seed 000 §4). A fixed list of keys misses ``Proxy-Authorization``, a key
called ``key`` or a ``?key=`` in a URL, so the check has two halves:

* **names** — a key, header name or URL query parameter whose normalised name
  (lower case, ``-``/``_``/spaces removed) is a credential name
  (:data:`CREDENTIAL_NAMES`), ends with a credential suffix
  (:data:`CREDENTIAL_SUFFIXES`: ``X-Api-Key``, ``OPENAI_API_KEY``,
  ``client_secret``, ``Proxy-Authorization``), or, where credentials end up
  (``connection``, ``executionBindings``), ends with ``token``/``key``;
* **values** — a string shaped like a credential whatever its name: an HTTP
  auth scheme with a credential (``Bearer …``, ``Basic …``), a JWT, a PEM
  private key, well-known token prefixes (``sk-…``, ``ghp_…``, ``xoxb-…``,
  ``AKIA…``, ``AIza…``), a URL with a password in it or with a credential
  query parameter.

Headers given as ``[name, value]`` pairs or ``{"name": .., "value": ..}``
objects are checked by their name too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

__all__ = ["CREDENTIAL_NAMES", "CREDENTIAL_SUFFIXES", "QUERY_NAMES", "find_credential", "is_credential_name",
           "is_credential_value"]

CREDENTIAL_NAMES: frozenset[str] = frozenset({
    "key", "apikey", "token", "secret", "password", "passwd", "pwd", "passphrase",
    "authorization", "proxyauthorization", "authentication", "cookie", "setcookie", "credential",
    "credentials", "bearer", "xamzcredential", "xamzsecuritytoken",
    "sessiontoken", "privatekey", "clientsecret", "accesskey", "secretkey",
})
# In a URL's query string a signature is a credential too (presigned URLs); as a key it is not
# (a thinking block's ``signature`` is the model's, not a secret).
QUERY_NAMES: frozenset[str] = frozenset({"sig", "signature", "xamzsignature", "googsignature", "accesstoken",
                                         "authtoken", "apikey", "key", "token", "code"})
CREDENTIAL_SUFFIXES: tuple[str, ...] = (
    "apikey", "password", "passwd", "secret", "accesstoken", "refreshtoken", "authtoken", "idtoken",
    "sessiontoken", "bearertoken", "privatekey", "secretkey", "accesskey", "authorization", "cookie",
    "credential", "credentials", "bearer",
)
# Where credentials would end up, any name ending like these is one too (``GITHUB_TOKEN``,
# ``azureKey``); elsewhere they must match exactly (``eosToken: "</s>"``, ``topKey`` are not).
_SECTION_SUFFIXES: tuple[str, ...] = ("token", "key")

_AUTH_SCHEME = re.compile(r"^\s*(bearer|basic|digest|token|apikey|negotiate|ntlm|aws4-hmac-sha256)\s+\S{8,}",
                          re.IGNORECASE)
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")
_PEM = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
_PREFIXED = re.compile(
    r"(?<![A-Za-z0-9])("
    r"sk-[A-Za-z0-9_-]{16,}|sk_(live|test)_[A-Za-z0-9]{16,}|rk_(live|test)_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35}"
    r"|hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,}"
    r")"
)
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_MAX_DEPTH = 64


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-.]", "", name).lower()


def is_credential_name(name: str, *, credential_section: bool = False) -> bool:
    norm = _norm(name)
    if not norm:
        return False
    if norm in CREDENTIAL_NAMES or norm.endswith(CREDENTIAL_SUFFIXES):
        return True
    return credential_section and norm.endswith(_SECTION_SUFFIXES)


def _url_credential(value: str) -> str | None:
    try:
        parts = urlsplit(value.strip())
    except ValueError:
        return None
    if parts.password:
        return "a password in the URL"
    for name, _ in parse_qsl(parts.query, keep_blank_values=False):
        if is_credential_name(name) or _norm(name) in QUERY_NAMES:
            return f"the query parameter {name!r}"
    for name, _ in parse_qsl(parts.fragment, keep_blank_values=False):
        if is_credential_name(name) or _norm(name) in QUERY_NAMES:
            return f"the fragment parameter {name!r}"
    return None


def is_credential_value(value: str) -> str | None:
    """Why ``value`` looks like a credential (``None`` if it does not)."""
    if len(value) < 8:
        return None
    if _AUTH_SCHEME.match(value):
        return "an HTTP authorization value"
    if _PEM.search(value):
        return "a private key"
    if _JWT.search(value):
        return "a JSON Web Token"
    if _PREFIXED.search(value):
        return "an API token"
    if _URL.match(value):
        return _url_credential(value)
    return None


def _pair(value: Any) -> tuple[str, Any] | None:
    """A header written as ``[name, value]`` or ``{"name": .., "value": ..}``."""
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
        return value[0], value[1]
    if isinstance(value, Mapping) and isinstance(value.get("name"), str) and "value" in value:
        return value["name"], value["value"]
    return None


def _filled(value: Any) -> bool:
    return value not in (None, "", [], {}) and not isinstance(value, bool)


def find_credential(value: Any, path: str, *, credential_section: bool = False) -> str | None:
    """``"<path>: <why>"`` for the first credential in ``value`` (a JSON value), else ``None``."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > _MAX_DEPTH:
            continue
        if isinstance(item, str):
            why = is_credential_value(item)
            if why:
                return f"{where}: {why}"
        elif isinstance(item, Mapping):
            pair = _pair(item)
            if pair is not None and _filled(pair[1]) and is_credential_name(pair[0],
                                                                            credential_section=credential_section):
                return f"{where}: a {pair[0]!r} credential"
            for key, inner in item.items():
                here = f"{where}.{key}"
                if isinstance(key, str) and _filled(inner) and is_credential_name(
                        key, credential_section=credential_section) and not isinstance(inner, (Mapping, list)):
                    return f"{here}: a credential name"
                stack.append((inner, here, depth + 1))
        elif isinstance(item, list):
            pair = _pair(item)
            if pair is not None and _filled(pair[1]) and is_credential_name(pair[0],
                                                                            credential_section=credential_section):
                return f"{where}: a {pair[0]!r} credential"
            stack.extend((inner, f"{where}[{i}]", depth + 1) for i, inner in enumerate(item))
    return None


def credential_names(names: Iterable[str]) -> list[str]:
    """The names in ``names`` that are credential names (for messages and tests)."""
    return [n for n in names if is_credential_name(n)]
