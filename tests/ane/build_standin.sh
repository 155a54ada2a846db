#!/usr/bin/env bash
# The ane backend on Linux: built with GCC's Objective-C against GNUstep Base
# and the stand-in framework (tests/ane_standin), then tested:
#   1. the stand-in self-test (it refuses what the device refuses);
#   2. the backend's C driver: call order, delta reload, budget, every failure
#      of the private API, and a framework lacking a class or missing;
#   3. the Python runtime tests through ORION_TEST_BACKEND=ane, and tests/ane;
#   4. 1 and 2 again built with ASan + UBSan, leak checks on (suppressions:
#      tests/ane/lsan.supp), and 3 under ASan with the runtime preloaded.
# 1-3 run once per stand-in mode (ANE_STANDIN_MODE, tests/ane_standin/standin.h):
# observed (what the real framework is seen to do: a naive delta reload is
# stale), verify (a load fails if the bundle changed after compile), permissive
# (a delta reload works), macos27 (several weight files fail the bundle hash; a
# request refuses a stats object) and compile-on-miss (a load of an edited temp
# folder compiles it, unseen unless timed: compiles are made slow there, as on
# the device); the backend must be right in each. 2 also runs with the device
# saying no (no ANE, a VM, Rosetta, macOS 14): ane unavailable, vane used.
# GNUstep's NSTemporaryDirectory() reads TMP (not TMPDIR): both are set.
# Before building: the Apple branch of the CMake files configured (-DAPPLE=ON:
# -fno-objc-arc, Foundation linked) and every Objective-C file parsed by clang
# with warnings as errors against GNUstep's headers: as much of the macOS
# build as Linux can check.
# Needs gobjc, libgnustep-base-dev and clang (installed here when missing, as root).
# Run from .ci/run with the test venv active: bash tests/ane/build_standin.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
stage() { printf '\n---- ane stand-in: %s\n' "$*"; }

if ! command -v gnustep-config >/dev/null || [ ! -x "$(gcc -print-prog-name=cc1obj)" ] ||
   ! command -v clang >/dev/null; then
  stage "installing gobjc libgnustep-base-dev clang"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    gobjc libgnustep-base-dev clang >/dev/null
fi

PYTESTS=(tests/test_runtime.py tests/test_sequence.py tests/test_surface.py tests/test_native.py tests/ane)
MODES=(observed verify permissive macos27 compile-on-miss)

run_mode() {   # $1: build dir; $2: sanitizer build (1) or not (0); $3: stand-in mode
  local b=$ROOT/$1 asan=$2
  export ORION_ANE_FRAMEWORK=$b/libANEStandin.so ANE_STANDIN_MODE=$3
  # Compiles take 100 ms in every mode, as on the device (tens of ms, loads ~2 ms):
  # the backend tells a compile hidden in a load (compile-on-miss) by its time, and
  # a stand-in compile of a few ms under ASan on a busy machine was within a slow
  # load's noise (a plain reload was once taken for one).
  export ANE_STANDIN_COMPILE_MS=100
  local tmp
  tmp=$(mktemp -d)
  local envs=()
  if [ "$asan" = 1 ]; then
    envs=(ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:malloc_context_size=40:abort_on_error=1
          LSAN_OPTIONS=suppressions=$ROOT/tests/ane/lsan.supp:print_suppressions=0
          UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
  fi
  stage "stand-in self-test ($1, $3)"
  env "${envs[@]}" TMPDIR="$tmp" TMP="$tmp" "$b/ane_standin_selftest"
  stage "backend through the C ABI ($1, $3)"
  env "${envs[@]}" "$b/ane_backend_test"
  env "${envs[@]}" ORION_ANE_FRAMEWORK="$b/libANEStandin_norequest.so" \
    "$b/ane_backend_test" --unavailable "class _ANERequest not found"
  env "${envs[@]}" ORION_ANE_FRAMEWORK=/nonexistent/AppleNeuralEngine \
    "$b/ane_backend_test" --unavailable "cannot load /nonexistent/AppleNeuralEngine"
  if [ "$3" = observed ]; then   # the device's answers do not depend on the mode
    env "${envs[@]}" ANE_STANDIN_HAS_ANE=0 "$b/ane_backend_test" --unavailable "hasANE] says"
    env "${envs[@]}" ANE_STANDIN_VM=1 "$b/ane_backend_test" --unavailable "a virtual machine"
    env "${envs[@]}" ANE_STANDIN_TRANSLATED=1 "$b/ane_backend_test" --unavailable "Rosetta"
    env "${envs[@]}" ANE_STANDIN_MACOS=14.6 "$b/ane_backend_test" --unavailable "needs macOS 15"
  fi
  stage "runtime tests through ORION_TEST_BACKEND=ane ($1, $3)"
  if [ "$asan" = 1 ]; then
    # Python is not instrumented: preload the runtimes, leak checks off for the
    # interpreter (live surface/program/object counts are checked instead). The
    # 20-step training runs only in the plain build: under ASan it adds minutes
    # and no C path that the other tests do not take.
    env LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)" \
      ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ORION_TEST_BACKEND=ane ORION_LIBRARY="$b/liborion.so" TMP="$tmp" \
      python -m pytest -q -p no:cacheprovider -k "not twenty_steps" "${PYTESTS[@]}"
  else
    ORION_TEST_BACKEND=ane ORION_LIBRARY="$b/liborion.so" TMP="$tmp" \
      python -m pytest -q -p no:cacheprovider "${PYTESTS[@]}"
  fi
  rm -rf "$tmp"
}

run_suite() {   # $1: build dir; $2: sanitizer build (1) or not (0)
  for mode in "${MODES[@]}"; do run_mode "$1" "$2" "$mode"; done
}

stage "macOS path, as far as Linux allows: the Apple branch of csrc/ane/ane.cmake"
apple=$(mktemp -d)
cmake -S . -B "$apple" -DAPPLE=ON -DCMAKE_OBJC_COMPILER=clang >/dev/null
grep -q -- "-fno-objc-arc" "$apple/CMakeFiles/orion.dir/flags.make"
grep -q -- "-framework Foundation" "$apple/CMakeFiles/orion.dir/link.txt"
rm -rf "$apple"
stage "clang, -fno-objc-arc, warnings as errors, against GNUstep headers (syntax only)"
for f in csrc/ane/*.m tests/ane_standin/*.m; do
  clang -fsyntax-only -fno-objc-arc -fobjc-exceptions -fobjc-runtime=gcc -std=gnu11 \
    -Wall -Wextra -Wno-unused-parameter -Werror -Icsrc -DGNUSTEP -DGNUSTEP_BASE_LIBRARY=1 \
    -DGNU_RUNTIME=1 -D_NATIVE_OBJC_EXCEPTIONS -fconstant-string-class=NSConstantString \
    -isystem /usr/include/GNUstep -isystem "$(gcc -print-file-name=include)" "$f"
done

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
