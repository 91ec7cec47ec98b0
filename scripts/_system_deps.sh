#!/usr/bin/env bash
# Test-only system programs from Debian's packages: headless Chromium (the inspector's browser tests), tmux
# (the terminal programs' tests) and libfaketime (a host process on a shifted wall clock). Installed when missing and this user may (root with apt-get);
# otherwise the tests that need them say what to install.
set -uo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || missing+=(faketime)
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing test programs: ${missing[*]} ..." >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null 2>&1 \
    || echo "could not install ${missing[*]}; the tests that need them will say so" >&2
fi
exit 0
