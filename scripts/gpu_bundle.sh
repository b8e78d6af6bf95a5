#!/usr/bin/env bash
# Packs the GPU check into one archive that runs on a GPU machine without building there: that
# machine's image has CUDA, NCCL and cuBLAS but not our other dependencies (MPI, protobuf,
# OpenBLAS, GoogleTest) and cannot install them. Builds the CUDA tree here, then packs
#   bin/   the gpu-labelled test programs, zero-train (with zero-checkpoint and gpt2_golden_check
#          for the GPT-2 on the GPU against PyTorch) and the GPU optimizer benchmark
#   lib/   every shared library they (and OpenMPI's plugins) load, except the C library, the C++
#          runtime and CUDA's own libraries, which the GPU machine has
#   mpi/   OpenMPI's plugins, help texts and orted, laid out under a prefix that OPAL_PREFIX
#          relocates
# and benchmarks/gpu_check.sh, which runs from the unpacked folder when given --bundle. The
# archive (xz, about 12 MB) is small enough to travel with the working tree to the GPU machine.
#
#   scripts/gpu_bundle.sh ARCHIVE     (e.g. .gpu-bundle.tar.xz; build dir: $ZERO_GPU_BUILD_DIR or
#                                      build-gpu-bundle)
#
# Then, on the GPU machine:
#   tar -xJf ARCHIVE -C /tmp && bash /tmp/zero-gpu-bundle/gpu_check.sh --bundle /tmp/zero-gpu-bundle OUTDIR
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 ARCHIVE" >&2
  exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
archive="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
build="${ZERO_GPU_BUILD_DIR:-$root/build-gpu-bundle}"
arch="${CUDA_ARCH:-90}"
staging="$(mktemp -d)"
trap 'rm -rf "$staging"' EXIT
bundle="$staging/zero-gpu-bundle"
mkdir -p "$bundle"

programs=(cuda_kernels_test transformer_kernels_gpu_test cuda_stream_test nccl_communicator_test
          engine_gpu_test memory_timeline_gpu_test zero-train zero-checkpoint gpt2_golden_check
          zero-bench-optimizer-gpu)

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DZERO_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" > /dev/null
cmake --build "$build" -j "$(nproc)" --target "${programs[@]}"

mkdir -p "$bundle/bin" "$bundle/lib"
for program in "${programs[@]}"; do cp "$build/bin/$program" "$bundle/bin/"; done
cp "$root/benchmarks/gpu_check.sh" "$bundle/"
if [[ -f "$root/benchmarks/torch_adamw_bench.py" ]]; then
  cp "$root/benchmarks/torch_adamw_bench.py" "$bundle/"
fi

# OPAL_PREFIX=$bundle/mpi makes OpenMPI look for its plugins and help texts under the bundle, at
# the places they have below its own prefix here.
mpi_path() { ompi_info --path "$1" --parsable | sed -n "s/^path:$1://p"; }
mpi_prefix=$(mpi_path prefix)
for kind in pkglibdir pkgdatadir; do
  from=$(mpi_path "$kind")
  to="$bundle/mpi${from#"$mpi_prefix"}"
  mkdir -p "$to"
  cp -r "$from/." "$to/"
done
# A process started without mpirun (a singleton, as the bundle runs its programs) forks OpenMPI's
# orted to serve it.
mkdir -p "$bundle/mpi/bin"
cp "$(mpi_path bindir)/orted" "$bundle/mpi/bin/"

# The libraries the GPU machine has of its own: the C library and its loader, the C++ runtime
# (newer there than here, and one process may hold only one), and CUDA's (matching its driver).
system_library='^(libc|libm|libdl|librt|libpthread|libresolv|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-.*)\.so'
copy_dependencies() {
  ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    while read -r name path; do
      if [[ ! "$name" =~ $system_library && ! -e "$bundle/lib/$name" ]]; then
        cp -L "$path" "$bundle/lib/$name"
      fi
    done
}
for file in "$bundle"/bin/* "$bundle/mpi/bin/orted" $(find "$bundle/mpi" -name '*.so'); do
  copy_dependencies "$file"
done

tar -C "$staging" -cf - zero-gpu-bundle | xz -T0 -6 > "$archive"
echo "gpu_bundle: $(du -sh "$bundle" | cut -f1) packed into $archive ($(du -h "$archive" | cut -f1))"
