#!/usr/bin/env bash
# Builds the llama.cpp peer of benchmarks/test_bench_llama_cpp.py once, into the active
# Python environment: llama-cpp-python compiles llama.cpp from its PyPI source (CPU only,
# tuned for this machine's instruction set), and gguf writes the model file it reads.
# It takes 10-30 minutes on 2 cores; the benchmark skips, naming this script, until the
# packages import. The same packages are the `bench` extra of pyproject.toml.
#
#   . venv/bin/activate && bash benchmarks/build_llama_cpp.sh
set -euo pipefail
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
# GGML_NATIVE: the peer gets this CPU's best kernels (AVX-512 here), as vane does,
# except AMX: built natively on a Xeon VM with AMX, llama.cpp 0.3.36 segfaults in
# ggml_backend_amx_mul_mat on every Q4_0 and Q8_0 model (f16 runs), so the benchmark
# lost its peer; its AVX-512 VNNI kernels remain. No server, examples, tests or curl:
# only the library the Python binding loads.
no_amx=""   # x86-64 flags: another CPU builds as it is
[ "$(uname -m)" = x86_64 ] && no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DCMAKE_C_FLAGS='$no_amx' \
-DCMAKE_CXX_FLAGS='$no_amx' -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF}"
# [server]: `python -m llama_cpp.server`, the peer of benchmarks/test_bench_serve.py;
# scikit-build-core: the sdist download below reads its metadata without build
# isolation, so the environment needs the build backend (a fresh venv has none)
python -m pip install --no-cache-dir "llama-cpp-python[server]>=0.3" "gguf>=0.10" \
  scikit-build-core
python -c "import llama_cpp, gguf; print('llama-cpp-python', llama_cpp.__version__)"

# llama.cpp's own server (`llama-server`, the peer of benchmarks/test_bench_serve.py's
# concurrent clients: -np slots, continuous batching), built from the same sources
# (the llama-cpp-python sdist vendors llama.cpp) into benchmarks/.llama.cpp/; the
# benchmark finds it through ORION_LLAMA_SERVER.
here="$(cd "$(dirname "$0")" && pwd)"
work="$here/.llama.cpp"
mkdir -p "$work"
python -m pip download --no-deps --no-binary :all: --no-build-isolation \
  "llama-cpp-python>=0.3" -d "$work" >/dev/null
tar xzf "$(ls "$work"/llama_cpp_python-*.tar.gz | tail -1)" -C "$work"
src="$(ls -d "$work"/llama_cpp_python-*/vendor/llama.cpp | tail -1)"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >/dev/null
cmake --build "$work/build" -j "${CMAKE_BUILD_PARALLEL_LEVEL}" --target llama-server
echo "export ORION_LLAMA_SERVER=$work/build/bin/llama-server"
