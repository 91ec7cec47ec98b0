#!/usr/bin/env bash
# Shared bootstrap: create .venv with Python 3.11+ and install pi-host into it.
# Re-installs when a pyproject.toml or this script changes (a stamp holds their hash).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.13 python3.12 python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      PY="$cand"; break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "pi-host needs Python 3.11 or newer on PATH" >&2; exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV ..." >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.pi-host-installed"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/clients/python/pyproject.toml" "$ROOT/scripts/_bootstrap.sh" | "$VENV/bin/python" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "installing pi-host and its dependencies into .venv ..." >&2
  # pip as the venv has it when it is 23.1 or newer (Python 3.11.4+ bundles one): it passes the
  # config settings below to editable builds. The build tools go into the venv itself, so each editable
  # build below runs in it (--no-build-isolation) instead of installing them into a throwaway build
  # environment first (about 5 s a build).
  upgrade=()
  if ! "$VENV/bin/python" -c 'import sys; from pip import __version__ as v; sys.exit(tuple(map(int, v.split(".")[:2])) < (23, 1))' 2>/dev/null; then
    upgrade=(--upgrade pip)
  fi
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${upgrade[@]}" "setuptools>=68" wheel >&2
  # the client SDK is its own distribution (pihost-client); the CLI's `chat`/`agent` commands use it.
  # compat: a plain path entry (.pth), which type checkers follow (mypy and pyright do not run the
  # import hook of the default editable mode, so code in this venv could not see pihost_client's types)
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
    --config-settings editable_mode=compat -e "$ROOT/clients/python[chat]" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation -e "$ROOT[test]" >&2
  echo "$WANT" > "$STAMP"
fi
# Byte-compile pi-host's own modules (only what changed since the last run is compiled again). Python
# reads these caches even where the environment forbids writing them at import (PYTHONDONTWRITEBYTECODE):
# without them every `serve` (and every host a test starts) compiles ~200 modules from source first,
# about 0.4 s of its start.
"$VENV/bin/python" -m compileall -q -j 0 "$ROOT/runtime" "$ROOT/actors" "$ROOT/protocol" "$ROOT/store" \
  "$ROOT/scripts" "$ROOT/clients/python/pihost_client" >/dev/null
