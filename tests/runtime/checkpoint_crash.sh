#!/bin/sh
# Crash safety, end to end on 2 ranks at stage 2 (ctest: checkpoint_crash):
#   1. rank 1 is killed (SIGKILL) inside the save of step 6, after writing its shard: the job
#      dies, step 6 is not in place, `latest` still names step 4;
#   2. the next job resumes from step 4, matches the uninterrupted run bit for bit, and its first
#      save removes the leftover;
#   3. rank 0 is killed after step 10's directory is in place but before `latest` is replaced:
#      a resume still starts from step 8;
#   4. zero-checkpoint verify passes, then a flipped byte in a shard is reported by verify and
#      refused by a load, both naming the file.
# usage: checkpoint_crash.sh MPIEXEC DRIVER ZERO_CHECKPOINT WORKDIR [MPIEXEC FLAGS...]
set -u
mpiexec=$1
driver=$2
tool=$3
work=$4
shift 4

fail() {
  echo "checkpoint_crash: FAILED: $*" >&2
  exit 1
}

rm -rf "$work"
mkdir -p "$work"
dir=$work/ckpt

"$mpiexec" "$@" -np 2 "$driver" --dir "$work/reference" --stage 2 --steps 8 \
  --losses "$work/reference.txt" || fail "the uninterrupted run failed"

# 1. Killed during a save.
if "$mpiexec" "$@" -np 2 "$driver" --dir "$dir" --stage 2 --steps 8 --save-every 2 \
  --fault kill-after-write@1 --fault-step 6 >"$work/killed.log" 2>&1; then
  fail "the job whose rank 1 was killed exited 0"
fi
[ -d "$dir/.tmp_step_00000006" ] || fail "the interrupted save left no temporary directory"
[ ! -e "$dir/step_00000006" ] || fail "the interrupted step 6 looks complete"
[ "$(cat "$dir/latest")" = step_00000004 ] || fail "latest is '$(cat "$dir/latest")', not step_00000004"

# 2. Resumed from the previous checkpoint: the same losses as the uninterrupted run.
"$mpiexec" "$@" -np 2 "$driver" --dir "$dir" --stage 2 --steps 8 --save-every 2 --resume \
  --expect-start 4 --expect "$work/reference.txt" --rel 0 || fail "the resumed run differs"
[ ! -e "$dir/.tmp_step_00000006" ] || fail "the leftover of the interrupted save is still there"
[ "$(cat "$dir/latest")" = step_00000008 ] || fail "latest does not name step_00000008"

# 3. Killed between the rename and the new `latest`.
if "$mpiexec" "$@" -np 2 "$driver" --dir "$dir" --stage 2 --steps 10 --save-every 2 --resume \
  --fault kill-before-latest@0 --fault-step 10 >"$work/killed2.log" 2>&1; then
  fail "the job whose rank 0 was killed exited 0"
fi
[ -f "$dir/step_00000010/manifest.pbtxt" ] || fail "step 10 was not renamed into place"
"$mpiexec" "$@" -np 2 "$driver" --dir "$dir" --stage 2 --steps 8 --resume --expect-start 8 ||
  fail "the resume after a kill before 'latest' did not start from step 8"

# 4. verify, then a flipped byte.
"$tool" verify "$dir" || fail "zero-checkpoint verify rejected a good checkpoint"
"$tool" info "$dir" | grep -q "step 8, seed 7" || fail "zero-checkpoint info does not show step 8"
file=$dir/step_00000008/rank_00001.bin
byte=$(od -An -tu1 -j 7 -N 1 "$file" | tr -d ' ')
printf "$(printf '\\%03o' $((255 - byte)))" | dd of="$file" bs=1 seek=7 conv=notrunc 2>/dev/null
if "$tool" verify "$dir" >"$work/verify.out" 2>"$work/verify.err"; then
  fail "zero-checkpoint verify accepted a flipped byte"
fi
grep -q "rank_00001.bin: checksum mismatch" "$work/verify.err" ||
  fail "verify did not name the file: $(cat "$work/verify.err")"
if "$mpiexec" "$@" -np 2 "$driver" --dir "$dir" --stage 2 --steps 8 --resume \
  >"$work/load.log" 2>&1; then
  fail "a load accepted a flipped byte"
fi
grep -q "rank_00001.bin: checksum mismatch" "$work/load.log" ||
  fail "the load error does not name the file: $(cat "$work/load.log")"
echo "checkpoint_crash: ok"
