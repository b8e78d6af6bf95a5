#!/bin/sh
# Installs the build into a scratch prefix, builds examples/user_project against it the way a
# user would (find_package(zero) found through CMAKE_PREFIX_PATH, nothing from the source or
# build tree), and runs the user's program on two ranks; that program fails unless its loss falls.
# With TORCH=ON (the build has the LibTorch adapter) it does the same for the LibTorch variant
# (examples/user_project/torch, find_package(zero COMPONENTS torch)); with OFF it checks that
# asking for that component fails at configure time, saying zero was built without it.
#
# usage: install_test.sh CMAKE BUILD_DIR SOURCE_DIR GENERATOR CXX_COMPILER TORCH MPIEXEC
#                        [MPIEXEC_FLAGS...]
set -eu

cmake=$1 build=$2 source=$3 generator=$4 cxx=$5 torch=$6 mpiexec=$7
shift 7

scratch=$(mktemp -d /tmp/zero_install_test_XXXXXX)
trap 'rm -rf "$scratch"' EXIT
prefix=$scratch/prefix

# Each step's output is shown only when the step fails.
run_quietly() {
  if ! "$@" > "$scratch/step.log" 2>&1; then
    cat "$scratch/step.log"
    echo "install_test: failed: $*" >&2
    exit 1
  fi
}

run_quietly "$cmake" --install "$build" --prefix "$prefix"
for installed in bin/zerorun bin/zero-train bin/zero-estimate include/zero/core/check.h \
                 include/zero/runtime/model.h include/zero/collectives/mpi_communicator.h \
                 lib/cmake/zero/zeroConfig.cmake lib/cmake/zero/zeroConfigVersion.cmake \
                 lib/cmake/zero/zeroTargets.cmake; do
  if [ ! -e "$prefix/$installed" ]; then
    echo "install_test: $installed is missing from the installed tree" >&2
    exit 1
  fi
done

# The package looks only for what the installed build used: one without the CUDA backend (no
# zero_kernels_cuda installed) looks for neither the CUDA toolkit nor NCCL.
config=$prefix/lib/cmake/zero/zeroConfig.cmake
if [ ! -e "$prefix/lib/libzero_kernels_cuda.a" ] &&
   grep -E 'find_dependency\((CUDAToolkit|NCCL)' "$config"; then
  echo "install_test: a build without CUDA installs a package that looks for CUDA or NCCL" >&2
  exit 1
fi

configure_user_project() {  # SOURCE BUILD
  "$cmake" -S "$1" -B "$2" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
}

run_quietly configure_user_project "$source/examples/user_project" "$scratch/build"
run_quietly "$cmake" --build "$scratch/build" -j 2
"$mpiexec" "$@" -np 2 "$scratch/build/user_model"

torch_project=$source/examples/user_project/torch
if [ "$torch" = ON ]; then
  for installed in include/zero/torch/torch_model.h lib/libzero_torch.a \
                   lib/cmake/zero/zeroTorchTargets.cmake; do
    if [ ! -e "$prefix/$installed" ]; then
      echo "install_test: $installed is missing from the installed tree" >&2
      exit 1
    fi
  done
  run_quietly configure_user_project "$torch_project" "$scratch/build_torch"
  run_quietly "$cmake" --build "$scratch/build_torch" -j 2
  "$mpiexec" "$@" -np 2 "$scratch/build_torch/user_torch_model"
elif configure_user_project "$torch_project" "$scratch/build_torch" > "$scratch/step.log" 2>&1; then
  echo "install_test: zero was built without LibTorch, yet find_package(zero COMPONENTS torch)" \
       "succeeded" >&2
  exit 1
elif ! grep -q "built without the LibTorch adapter" "$scratch/step.log"; then
  cat "$scratch/step.log"
  echo "install_test: the failed torch component does not say zero was built without it" >&2
  exit 1
fi
