#!/usr/bin/env bash
# libFuzzer over the two parsers of hostile input -- the MIL parser and
# verifier, and the weight blob reader -- for a bounded time each, under ASan +
# UBSan. Any crash, leak or sanitizer report fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_FUZZ=${ORION_FUZZ_SECONDS:-45}
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DORION_FUZZ=ON >/dev/null
cmake --build build-fuzz -j2 --target fuzz_mil_parser fuzz_blob >/dev/null
mkdir -p build-fuzz/corpus build-fuzz/blob_corpus
./build-fuzz/fuzz_mil_parser -max_total_time="$SECONDS_TO_FUZZ" -max_len=8192 \
  build-fuzz/corpus tests/fuzz/corpus
./build-fuzz/fuzz_blob -max_total_time="$SECONDS_TO_FUZZ" -max_len=4096 \
  build-fuzz/blob_corpus tests/fuzz/blob_corpus
