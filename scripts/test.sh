#!/usr/bin/env bash
# The whole test suite: set-up, build, then every CTest test (unit, mpi; gpu tests skip with a
# message on machines without a GPU). Extra arguments go to ctest, e.g. -L unit or -R engine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZERO_BUILD_DIR:-$root/build}"

bash "$root/scripts/build.sh"
# MPI tests declare PROCESSORS 2, so -j 2 runs them one at a time beside nothing else.
ctest --test-dir "$build" --output-on-failure -j 2 --timeout 900 "$@"
