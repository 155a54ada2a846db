#!/usr/bin/env bash
# A wheel built from the tree installs into a clean venv and runs from there.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf dist-ci && python -m pip wheel -q --no-deps -w dist-ci .
python3 -m venv /tmp/orion-wheel-venv
/tmp/orion-wheel-venv/bin/python -m pip install -q dist-ci/*.whl
cd /tmp
/tmp/orion-wheel-venv/bin/python -c "import orion; print(orion.__version__, orion.backends())"
/tmp/orion-wheel-venv/bin/orion --help >/dev/null
