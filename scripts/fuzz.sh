#!/usr/bin/env bash
# Fuzzing CI: builds the libFuzzer targets of tests/fuzz with clang (ZERO_FUZZ=ON: coverage
# instrumentation, ASan and UBSan) and runs each for a fixed time, starting from a copy of its
# seed corpus, so the repository's files are never modified. The regressions are not fuzzed
# from: the unit tests fuzz_replay_<target> replay them on every build, and some are large
# inputs that would slow the mutations down.
#
#   fuzz_config    the training-config parser (JSON and protobuf text format)
#   fuzz_hostfile  zerorun's hostfile parser and the mpirun command built from it
#   fuzz_manifest  the checkpoint manifest reader
#
# Exits non-zero when a fuzzer finds a crash, a leak, a timeout or a memory blow-up, and prints
# the input that causes it: copy that file into tests/fuzz/regressions/<target>/ (the unit test
# fuzz_replay_<target> then replays it on every build) and fix the parser.
#
# Build directory: $ZERO_FUZZ_BUILD_DIR, else build-fuzz/ in the repository. Seconds per target:
# $ZERO_FUZZ_SECONDS, else 30 (with the build, about four minutes on two cores). Extra arguments
# go to every fuzzer (e.g. -seed=1).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZERO_FUZZ_BUILD_DIR:-$root/build-fuzz}"
seconds="${ZERO_FUZZ_SECONDS:-30}"
targets=(config hostfile manifest)

bash "$root/scripts/setup.sh"

start=$(date +%s)
mkdir -p "$build"
# Host code only: the fuzzers need neither CUDA nor the GPU. -O1 and line tables only, as the
# sanitizer builds (scripts/sanitize.sh): half the compile time, and a crash still names its lines.
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DZERO_CUDA=OFF -DZERO_FUZZ=ON >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
echo "fuzz: build took $(($(date +%s) - start)) s"

failed=()
for target in "${targets[@]}"; do
  work="$build/fuzz-work/$target"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp -R "$root/tests/fuzz/corpus/$target/." "$work/corpus/"
  echo "fuzz: $target for $seconds s"
  # -timeout: one input running this long counts as a hang. -rss_limit_mb: the process growing
  # past this is a memory blow-up. -max_len: configs, hostfiles and manifests are small files.
  if ! "$build/bin/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=8192 -dict="$root/tests/fuzz/$target.dict" -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" "$@" "$work/corpus" >"$work/fuzz.log" 2>&1; then
    tail -n 60 "$work/fuzz.log"
    failed+=("$target")
    for input in "$work/artifacts"/*; do
      [ -e "$input" ] || continue
      echo "fuzz: $target found a failing input: $input"
      echo "fuzz:   reproduce with: $build/bin/fuzz_$target $input"
      echo "fuzz:   then copy it into tests/fuzz/regressions/$target/ and fix the parser"
    done
    continue
  fi
  grep -E "^Done [0-9]+ runs" "$work/fuzz.log" | tail -n 2 || true
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: all targets ran ${seconds} s each without a failure"
