#!/bin/sh
# Installs the build into a scratch prefix, builds examples/user_project against it the way a
# user would (find_package(zero) found through CMAKE_PREFIX_PATH, nothing from the source or
# build tree), and runs the user's program on two ranks; that program fails unless its loss falls.
#
# usage: install_test.sh CMAKE BUILD_DIR SOURCE_DIR GENERATOR CXX_COMPILER MPIEXEC [MPIEXEC_FLAGS...]
set -eu

cmake=$1 build=$2 source=$3 generator=$4 cxx=$5 mpiexec=$6
shift 6

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

run_quietly "$cmake" -S "$source/examples/user_project" -B "$scratch/build" -G "$generator" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
run_quietly "$cmake" --build "$scratch/build" -j 2

"$mpiexec" "$@" -np 2 "$scratch/build/user_model"
