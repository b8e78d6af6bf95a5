#!/usr/bin/env bash
# zero-estimate --memory-limit names the most sequences per rank each activation checkpointing
# setting fits, exactly as zero-train's budget counts them: for none, selective, full and full
# with the checkpoints spilled to NVMe, zero-train trains at that micro-batch and refuses one
# sequence more at start (exit 3, out of memory). A GPT-2 of 6 layers, 64 wide, T = 16, stage 3,
# 1 rank, fp32, in 8 MiB (the spill keeps 2 of the 6 checkpoints in memory); the data are this
# repository's README as bytes (any text will do).
#   gpt2_largest_micro_batch.sh BIN_DIR WORK_DIR MPIEXEC [FLAGS...]
set -euo pipefail
bin="$1"; work="$2"; shift 2
mpiexec=("$@")
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rm -rf "$work"
mkdir -p "$work/spill"
"$bin/zero-tokenize" "$root/README.md" --out "$work/tokens.bin" > /dev/null
shape=(--n-layer 6 --n-head 4 --n-embd 64 --vocab-size 256 --block-size 64 --seq-len 16)
limit=8M

# most SETTING [FLAGS...]: the estimate's figure for SETTING.
most() {
  local setting="$1"
  shift
  "$bin/zero-estimate" --model gpt2 "${shape[@]}" --ranks 1 --stage 3 --dtype fp32 \
    --micro-batch 1 --memory-limit "$limit" "$@" |
    sed -nE "s/.*the most sequences per rank: none ([0-9]+), selective ([0-9]+), full ([0-9]+)$/\\1 \\2 \\3/p" |
    awk -v s="$setting" '{ print (s == "none" ? $1 : s == "selective" ? $2 : $3) }'
}

# train B FLAGS...: zero-train's exit code at micro-batch B.
train() {
  local batch="$1"
  shift
  local rc=0
  "${mpiexec[@]}" -np 1 "$bin/zero-train" --model gpt2 "${shape[@]}" --stage 3 --steps 1 \
    --global-batch "$batch" --data "$work/tokens.bin" --memory-limit "$limit" "$@" \
    > "$work/run.log" 2>&1 || rc=$?
  echo "$rc"
}

check() {
  local setting="$1" fits="$2"
  shift 2
  [[ "$fits" =~ ^[1-9][0-9]*$ ]] || { echo "FAIL: no figure for $setting"; exit 1; }
  local rc
  rc="$(train "$fits" "$@")"
  if [ "$rc" != 0 ]; then cat "$work/run.log"; echo "FAIL: $setting at $fits exited $rc"; exit 1; fi
  rc="$(train $((fits + 1)) "$@")"
  if [ "$rc" != 3 ] || ! grep -q "out of memory" "$work/run.log"; then
    cat "$work/run.log"; echo "FAIL: $setting at $((fits + 1)) exited $rc, not refused (3)"; exit 1
  fi
  echo "$setting: $fits sequences fit in $limit, $((fits + 1)) are refused"
}

check none "$(most none)"
check selective "$(most selective)" --activation-checkpointing selective
check full "$(most full)" --activation-checkpointing full
check "full, spilled" "$(most full --checkpoint-nvme-path "$work/spill")" \
  --activation-checkpointing full --checkpoint-nvme-path "$work/spill"
