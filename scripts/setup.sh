#!/usr/bin/env bash
# Installs every build and test dependency from Debian's packages (Debian 12, as root).
# A no-op when everything is present: dpkg is asked first and apt only runs for what is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  openmpi-bin libopenmpi-dev
  protobuf-compiler libprotobuf-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev nlohmann-json3-dev
  libdnnl-dev  # oneDNN: the bf16 products in bf16 on CPUs with bf16 arithmetic
  liburing-dev  # io_uring for NVMe offload
  gnuplot-nox python3
  clang libclang-rt-14-dev
  iproute2  # ip and tc, for the network namespaces of the multi-node tests
  fortunes  # English text (/usr/share/games/fortunes) for zero-tokenize and the GPT-2's tests
  libtorch-dev  # LibTorch 1.13 (CPU) for the torch/ adapter: two translation units, ~30 s
  pybind11-dev  # torch's C++ extensions include it: the report's DeepSpeed CPUAdam comparison
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages: ${missing[*]}; run this script as root (or install them)" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
