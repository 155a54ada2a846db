#!/usr/bin/env bash
# The ane backend on Linux: built with GCC's Objective-C against GNUstep Base
# and the stand-in framework (tests/ane_standin), then tested:
#   1. the stand-in self-test (it refuses what the device refuses);
#   2. the backend's C driver: call order, delta reload, budget, every failure
#      of the private API, and a framework lacking a class or missing;
#   3. the Python runtime tests through ORION_TEST_BACKEND=ane, and tests/ane;
#   4. 1 and 2 again built with ASan + UBSan, leak checks on (suppressions:
#      tests/ane/lsan.supp), and 3 under ASan with the runtime preloaded.
# Needs gobjc and libgnustep-base-dev (installed here when missing, as root).
# Run from .ci/run with the test venv active: bash tests/ane/build_standin.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
stage() { printf '\n---- ane stand-in: %s\n' "$*"; }

if ! command -v gnustep-config >/dev/null || [ ! -x "$(gcc -print-prog-name=cc1obj)" ]; then
  stage "installing gobjc libgnustep-base-dev"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    gobjc libgnustep-base-dev >/dev/null
fi

PYTESTS=(tests/test_runtime.py tests/test_surface.py tests/test_native.py tests/ane)

run_suite() {   # $1: build dir; $2: sanitizer build (1) or not (0)
  local b=$ROOT/$1 asan=$2
  export ORION_ANE_FRAMEWORK=$b/libANEStandin.so
  local envs=()
  if [ "$asan" = 1 ]; then
    envs=(ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:malloc_context_size=40:abort_on_error=1
          LSAN_OPTIONS=suppressions=$ROOT/tests/ane/lsan.supp:print_suppressions=0
          UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
  fi
  stage "stand-in self-test ($1)"
  env "${envs[@]}" TMPDIR="$(mktemp -d)" "$b/ane_standin_selftest"
  stage "backend through the C ABI ($1)"
  env "${envs[@]}" "$b/ane_backend_test"
  env "${envs[@]}" ORION_ANE_FRAMEWORK="$b/libANEStandin_norequest.so" \
    "$b/ane_backend_test" --unavailable "class _ANERequest not found"
  env "${envs[@]}" ORION_ANE_FRAMEWORK=/nonexistent/AppleNeuralEngine \
    "$b/ane_backend_test" --unavailable "cannot load /nonexistent/AppleNeuralEngine"
  stage "runtime tests through ORION_TEST_BACKEND=ane ($1)"
  if [ "$asan" = 1 ]; then
    # Python is not instrumented: preload the runtimes, leak checks off for the
    # interpreter (live surface/program/object counts are checked instead).
    env LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
      ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ORION_TEST_BACKEND=ane ORION_LIBRARY="$b/liborion.so" \
      python -m pytest -q -p no:cacheprovider "${PYTESTS[@]}"
  else
    ORION_TEST_BACKEND=ane ORION_LIBRARY="$b/liborion.so" \
      python -m pytest -q -p no:cacheprovider "${PYTESTS[@]}"
  fi
}

stage "build (GCC Objective-C, GNUstep Base)"
cmake -S . -B build-ane-standin -DCMAKE_BUILD_TYPE=Release \
  -DORION_WITH_ANE=ON -DORION_ANE_STANDIN=ON >/dev/null
cmake --build build-ane-standin -j2 >/dev/null
run_suite build-ane-standin 0

stage "build with ASan + UBSan"
cmake -S . -B build-ane-standin-asan -DCMAKE_BUILD_TYPE=Debug -DORION_SANITIZE=ON \
  -DORION_WITH_ANE=ON -DORION_ANE_STANDIN=ON >/dev/null
cmake --build build-ane-standin-asan -j2 >/dev/null
run_suite build-ane-standin-asan 1
stage "done"
