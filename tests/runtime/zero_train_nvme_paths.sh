#!/usr/bin/env bash
# zero-train's NVMe paths are checked at start, before the engine, on every rank at once (exit 2,
# a setup error, naming the path): an offload directory that does not exist, one that is a file,
# one on a read-only file system; and the files all ranks of a node write to one file system are
# counted together: two ranks sharing a tmpfs with room for one rank's files are refused naming
# the sum and the free space (each rank alone would fit), for the offload files and for the
# activation spill, and a tmpfs with room for both trains. The tmpfs cases need root for a
# private mount namespace; without, they exit 77 (skipped) after the others.
#   zero_train_nvme_paths.sh ZERO_TRAIN DATA WORKDIR MPIEXEC [MPIEXEC FLAGS...]
set -uo pipefail
train="$1" data="$2" work="$3"
shift 3
mpiexec=("$@")
rm -rf "$work" && mkdir -p "$work/fs" || exit 1
touch "$work/a_file"
failures=0
# NAME OUTPUT EXPECTED...: every EXPECTED line is in OUTPUT.
expect() {
  local name="$1" out="$2"
  shift 2
  echo "--- $name:"
  echo "$out"
  for want in "$@"; do
    grep -qF -- "$want" <<<"$out" || { echo "FAIL: $name: missing: $want"; failures=$((failures + 1)); }
  done
}
# OPTIMIZER_DIR PARAM_DIR: a stage-3 config offloading both to NVMe (252 KiB per rank in all).
config() {
  local file="$work/offload_$RANDOM.json"
  printf '{"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "%s"}, "offload_param": {"device": "nvme", "nvme_path": "%s"}}}\n' \
    "$1" "$2" >"$file"
  echo "$file"
}
run() {  # ARGS...: zero-train on 2 ranks; prints its output and exit code
  "${mpiexec[@]}" -np 2 "$train" --steps 1 "$@" 2>&1
  echo "exit $?"
}
expect "missing directory" "$(run --config "$(config "$work/absent" "$work")")" "exit 2" \
  "nvme_path $work/absent cannot take" "No such file or directory (errno 2)"
expect "a file" "$(run --config "$(config "$work" "$work/a_file")")" "exit 2" \
  "nvme_path $work/a_file cannot take" "Not a directory (errno 20)"
if [[ "$(id -u)" -ne 0 ]] || ! unshare -m --propagation private true 2>/dev/null; then
  echo "the tmpfs cases skipped: they need root to mount a tmpfs in a private mount namespace"
  [[ $failures -eq 0 ]] || exit 1
  exit 77
fi
# OPTIONS ARGS...: zero-train on 2 ranks with a tmpfs mounted with OPTIONS on $work/fs in its
# own mount namespace (nothing stays mounted).
run_on() {
  local options="$1"
  shift
  unshare -m --propagation private bash -c \
    'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"' _ "$options" "$work/fs" \
    "${mpiexec[@]}" -np 2 "$train" --steps 1 "$@" 2>&1
  echo "exit $?"
}
both="$(config "$work/fs" "$work/fs")"
expect "read-only" "$(run_on size=1m,ro --config "$both")" "exit 2" \
  "nvme_path $work/fs cannot take" "Read-only file system (errno 30)"
# 252 KiB per rank: 400 KiB hold one rank's files, not both.
expect "shared, too small" "$(run_on size=400k --config "$both")" "exit 2" \
  "$work/fs: its file system has 409600 bytes (400.00 KiB) free, but the 2 rank(s) on this node write 516096 bytes (504.00 KiB) to it"
expect "shared, room for both" "$(run_on size=1m --config "$both")" "exit 0" "step     1/1"
# The spill: 2 sequences of 32 tokens, 64 wide, per rank: 2 blocks x 16 KiB each; 48 KiB hold
# one rank's checkpoints, not both.
spill=(--model gpt2 --n-layer 2 --n-head 4 --n-embd 64 --vocab-size 256 --block-size 64
  --seq-len 32 --global-batch 4 --data "$data" --activation-checkpointing full
  --checkpoint-nvme-path "$work/fs")
expect "spill shared, too small" "$(run_on size=48k "${spill[@]}")" "exit 2" \
  "$work/fs: its file system has 49152 bytes (48.00 KiB) free, but the 2 rank(s) on this node write 65536 bytes (64.00 KiB) to it"
expect "spill shared, room for both" "$(run_on size=1m "${spill[@]}")" "exit 0" "step     1/1"
[[ $failures -eq 0 ]] || { echo "$failures check(s) failed"; exit 1; }
echo "every NVMe path case ended as expected"
