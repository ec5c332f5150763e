#!/usr/bin/env bash
# One-time set-up and build: installs every Debian package the build and tests need,
# configures with CMake (Ninja, ccache) and builds into ./build.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libboost-dev libboost-program-options-dev libboost-filesystem-dev
  libspdlog-dev libtomlplusplus-dev nlohmann-json3-dev libicu-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # The server's HTTP library (header-only); io_uring for streaming MoE experts.
  libcpp-httplib-dev liburing-dev
  # Vulkan backend: headers, volk (the run-time loader, compiled in) and the shader
  # compiler at build time; Mesa's drivers (lavapipe, a CPU Vulkan device) so its
  # conformance tests run without a GPU.
  libvulkan-dev libvulkan-volk-dev glslang-tools mesa-vulkan-drivers
  # Fuzzing (fuzz/, scripts/test.sh): clang and its libFuzzer / sanitizer runtimes.
  clang libclang-rt-dev
  # Distributed runs (dist/, docs/distributed.md): Open MPI's library and its mpirun.
  libopenmpi-dev openmpi-bin
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Node.js and npm for the server's tests with the official OpenAI client (a machine
# may already have both from elsewhere: then Debian's packages are not needed).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup: installing nodejs npm"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"

# The official OpenAI and Anthropic clients for the server tests, and ajv (JSON Schema
# validation of structured output), into the build tree (not committed).
for pkg in openai@4.95.0 @anthropic-ai/sdk@0.60.0 ajv@8.17.1; do
  if [ ! -f "$BUILD_DIR/node/node_modules/${pkg%@*}/package.json" ]; then
    mkdir -p "$BUILD_DIR/node"
    npm install --prefix "$BUILD_DIR/node" --no-audit --no-fund --loglevel=error "$pkg" >/dev/null
  fi
done
