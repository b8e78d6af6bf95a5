#!/usr/bin/env bash
# A disk error during a checkpoint save, end to end through zero-train:
#   disk_fault.sh RUN_FAULT_JOB MPIEXEC "MPIEXEC_FLAGS" ZERO_TRAIN ZERO_CHECKPOINT WORKDIR
# 1. a clean run saves step 2; 2. a resumed run whose save of step 4 hits a write error on
# rank 1 must fail on every rank with the error named, within its bound; 3. the checkpoint of
# step 2 is still `latest`, verifies, and a resume from it trains on.
set -euo pipefail
run_fault_job="$1"
mpiexec="$2"
read -r -a flags <<<"$3"
zero_train="$4"
zero_checkpoint="$5"
work="$6"
rm -rf "$work" && mkdir -p "$work"
ckpt="$work/checkpoints"

"$mpiexec" "${flags[@]}" -np 2 "$zero_train" --steps 2 --save-dir "$ckpt" --save-every 2 \
  >"$work/first.log" 2>&1 || { cat "$work/first.log"; exit 1; }

ZERO_TEST_CHECKPOINT_FAULT=write@1 bash "$run_fault_job" --within 30 --binary "$zero_train" \
  --expect "rank 1.*(write|I/O error|EIO)" -- \
  "$mpiexec" "${flags[@]}" -x ZERO_TEST_CHECKPOINT_FAULT -np 2 "$zero_train" --steps 4 \
  --save-dir "$ckpt" --save-every 2 --resume latest

latest="$(cat "$ckpt/latest")"
if [[ "$latest" != *step_00000002* ]]; then
  echo "disk_fault: FAIL: latest is '$latest', expected step 2" >&2
  exit 1
fi
if ls -d "$ckpt"/.tmp_* >/dev/null 2>&1; then
  echo "disk_fault: FAIL: a temporary directory was left behind" >&2
  exit 1
fi
"$zero_checkpoint" verify "$ckpt" || { echo "disk_fault: FAIL: verify" >&2; exit 1; }
"$mpiexec" "${flags[@]}" -np 2 "$zero_train" --steps 4 --save-dir "$ckpt" --resume latest \
  >"$work/resume.log" 2>&1 || { cat "$work/resume.log"; exit 1; }
grep -q "resumed from latest at step 2" "$work/resume.log" || {
  cat "$work/resume.log"
  echo "disk_fault: FAIL: the resume did not start at step 2" >&2
  exit 1
}
echo "disk_fault: PASS: the save failed on every rank, step 2 stayed whole and resumed"
