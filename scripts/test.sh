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

# Sanitizer build: only what the GGUF parser test needs.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTESSERA_SANITIZE=ON >/dev/null
cmake --build build-asan --target test_gguf -j"$(nproc)"
echo "== GGUF parser tests under ASan+UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan -L gguf -j"$(nproc)" --output-on-failure --timeout 600

echo "== full suite"
# Let the vulkan backend use a CPU Vulkan device (Mesa's lavapipe) so its conformance
# and fixture tests run on machines without a GPU.
export TESSERA_VULKAN_ALLOW_CPU=1
ctest --test-dir build -j"$(nproc)" --output-on-failure --timeout 900
