#!/usr/bin/env bash
# Installs every build and test dependency from Debian's packages (Debian 12, as root), then
# TensorBoard's own reader into a Python virtual environment (below). A no-op when everything is
# present: dpkg and the environment are asked first, and apt and pip only run for what is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  openmpi-bin libopenmpi-dev
  protobuf-compiler libprotobuf-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev nlohmann-json3-dev
  libdnnl-dev  # oneDNN: the bf16 products in bf16 on CPUs with bf16 arithmetic
  ocl-icd-opencl-dev  # only recommended by libdnnl-dev, but its dnnl-config.cmake requires OpenCL
  liburing-dev  # io_uring for NVMe offload
  gnuplot-nox python3 python3-venv
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

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing packages: ${missing[*]}; run this script as root (or install them)" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The `tensorboard` package from PyPI (Debian has none), for tensorboard_reads_monitors: TensorBoard's
# own reader on a run's event files. In the user's cache rather than a build directory, so that
# every build tree and fresh clone on the machine shares one copy (about 100 MB) and a clean build
# does not download it again; tests/runtime/CMakeLists.txt looks in the same place, and
# ZERO_TENSORBOARD_VENV moves both. Without PyPI (no network) the test skips, so a failure here
# only warns.
venv="${ZERO_TENSORBOARD_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/zero/tensorboard-venv}"
if ! "$venv/bin/python" -c "import tensorboard" > /dev/null 2>&1; then
  echo "setup: installing tensorboard into $venv"
  if ! { python3 -m venv "$venv" && "$venv/bin/python" -m pip install -q "tensorboard>=2.14,<3"; }; then
    echo "setup: WARNING: could not install tensorboard into $venv (see above); the test" \
         "tensorboard_reads_monitors will skip" >&2
  fi
fi
