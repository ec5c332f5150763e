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
  # Vulkan backend: headers and the shader compiler at build time; Mesa's drivers
  # (lavapipe, a CPU Vulkan device) so its conformance tests run without a GPU.
  libvulkan-dev glslang-tools mesa-vulkan-drivers
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

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
