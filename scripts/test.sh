#!/usr/bin/env bash
# Set up, build and run every test: the GGUF malformed-file suite under
# AddressSanitizer + UndefinedBehaviorSanitizer, then the whole suite (ctest, in
# parallel). Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

if [ ! -d ../shared/fixtures ]; then
  echo "test: note: ../shared/fixtures is missing; fixture tests will be reported as skipped" >&2
fi

# Sanitizer build: the GGUF parser test, and the server with the CPU backends for
# its client tests (16 concurrent streaming clients among them).
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTESSERA_SANITIZE=ON \
  -DTESSERA_NODE_MODULES_DIR="$PWD/build/node/node_modules" >/dev/null
cmake --build build-asan --target test_gguf tessera backend_cpu_scalar backend_cpu_avx512 loader_gguf -j"$(nproc)"
echo "== GGUF parser tests and the server's client tests under ASan+UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan -L 'gguf|server' -j"$(nproc)" --output-on-failure --timeout 600

echo "== full suite"
# Let the vulkan backend use a CPU Vulkan device (Mesa's lavapipe) so its conformance
# and fixture tests run on machines without a GPU.
export TESSERA_VULKAN_ALLOW_CPU=1
ctest --test-dir build -j"$(nproc)" --output-on-failure --timeout 900
