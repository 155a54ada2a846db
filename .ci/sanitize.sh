#!/usr/bin/env bash
# The C core built with -fsanitize=address,undefined, driven by the quick test
# suite (README's `pytest`: its model, training and fuzz tests run the C core; the
# `slow` tests mostly repeat those paths at larger sizes). Python itself
# is not instrumented, so the ASan
# runtime is preloaded; leak checking is off for the Python process (the
# interpreter keeps allocations alive until exit) -- the tests check live
# surface/program counts instead, and the C test drivers run with leak checks on.
# It includes tests/hostile/ (FIFOs, bad headers, 40k-statement programs).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DORION_SANITIZE=ON >/dev/null
cmake --build build-asan -j2 >/dev/null
ASAN_LIB=$(gcc -print-file-name=libasan.so)
UBSAN_LIB=$(gcc -print-file-name=libubsan.so)
LD_PRELOAD="$ASAN_LIB:$UBSAN_LIB" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
ORION_LIBRARY="$PWD/build-asan/liborion.so" \
  pytest -p no:cacheprovider -q
