#!/usr/bin/env bash
# The checkpoint spill's directory is checked at start (exit 2, before step 1): one that does not
# exist, one that cannot be written (a read-only tmpfs) and one too small for every checkpoint
# (a tmpfs of 32 KiB for 2 blocks x 32 KiB) are refused naming the path (and both numbers); one
# of 1 MiB trains. Needs root for a private mount namespace; exits 77 (skipped) without.
#   gpt2_spill_refusals.sh ZERO_TRAIN DATA WORKDIR MPIEXEC [MPIEXEC FLAGS...]
set -euo pipefail
train="$1" data="$2" work="$3"
shift 3
if [[ "$(id -u)" -ne 0 ]] || ! unshare -m --propagation private true 2>/dev/null; then
  echo "skipped: needs root to mount a small tmpfs in a private mount namespace"
  exit 77
fi
mkdir -p "$work/fs"
# 4 sequences of 32 tokens, 64 wide, on one rank: a checkpoint of 4 x 32 x 64 x 4 = 32 KiB.
flags=(--model gpt2 --n-layer 2 --n-head 4 --n-embd 64 --vocab-size 256 --block-size 64
  --seq-len 32 --global-batch 4 --steps 1 --data "$data" --activation-checkpointing full)
# OPTIONS DIR: zero-train with its checkpoints spilled to DIR, a tmpfs mounted with OPTIONS in
# its own mount namespace (nothing stays mounted); prints its output and exit code.
train_on() {
  local options="$1" dir="$2"
  shift 2
  set +e
  unshare -m --propagation private bash -c \
    'mount -t tmpfs -o "$1" tmpfs "$2" && shift 2 && exec "$@"' _ "$options" "$work/fs" \
    "${mpiexec[@]}" -np 1 "$train" "${flags[@]}" --checkpoint-nvme-path "$dir" 2>&1
  echo "exit $?"
  set -e
}
mpiexec=("$@")
expect() {  # NAME OUTPUT EXPECTED...
  local name="$1" out="$2"
  shift 2
  echo "--- $name:"
  echo "$out"
  for want in "$@"; do grep -qF -- "$want" <<<"$out" || { echo "missing: $want"; exit 1; }; done
}
expect "no such directory" "$(train_on size=1m "$work/fs/absent")" "exit 2" \
  "nvme_path $work/fs/absent cannot take rank 0's activation checkpoints" \
  "No such file or directory (errno 2)"
expect "read-only" "$(train_on size=1m,ro "$work/fs")" "exit 2" \
  "nvme_path $work/fs cannot take rank 0's activation checkpoints" \
  "Read-only file system (errno 30)"
expect "full" "$(train_on size=32k "$work/fs")" "exit 2" "nvme_path $work/fs has 32768 bytes" \
  "but rank 0's activation checkpoints (2 blocks x 32768 bytes) needs 65536 bytes"
expect "room" "$(train_on size=1m "$work/fs")" "exit 0" "step     1/1"
