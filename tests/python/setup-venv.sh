#!/usr/bin/env bash
# Creates or reuses the Python venv with grpc-python from PyPI (requirements.txt beside this
# file) that tests/tests/grpc_python.rs runs agent_client.py in. Usage: setup-venv.sh [VENV]
# (default $BLOCKJANITOR_PY_VENV or /var/cache/blockjanitor-py/venv). Reuses the venv when it
# was made from the same requirements and imports them; otherwise recreates it (root installs
# Debian's python3-venv first when Python lacks ensurepip). Exits non-zero saying why on failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:-${BLOCKJANITOR_PY_VENV:-/var/cache/blockjanitor-py/venv}}
req="$here/requirements.txt"

if [ -x "$venv/bin/python" ] && cmp -s "$req" "$venv/.requirements" &&
  "$venv/bin/python" -c 'import grpc, grpc_health.v1, grpc_reflection.v1alpha, google.protobuf' 2>/dev/null; then
  exit 0
fi
command -v python3 >/dev/null || { echo "setup-venv: no python3" >&2; exit 1; }
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  . "$here/../../scripts/lib.sh"
  install_missing setup-venv.sh python3-venv
fi
echo "setup-venv: creating $venv from $req" >&2
mkdir -p "$(dirname "$venv")"
python3 -m venv --clear "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
cp "$req" "$venv/.requirements"
