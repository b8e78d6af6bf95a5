#!/usr/bin/env bash
# Settings that would do nothing are said, never ignored in silence:
#   resume_no_ops.sh WORKDIR TOKENS -- LAUNCH... (LAUNCH: mpirun ... zero-train)
# 1. a resume whose --steps are already done (at or before the checkpoint's step) is refused
# with exit code 2; 2. --seed on a resume, which keeps the checkpoint's seed, is a warning;
# 3. a resumed run none of whose steps is a multiple of --val-every is a warning; 4. a validation
# set with fewer batches than the default --val-batches validates on those it has, and says so.
set -uo pipefail
work="$1"
tokens="$2"
shift 3
launch=("$@")
rm -rf "$work" && mkdir -p "$work"
failures=0
fail() {
  echo "FAIL: $1"
  failures=$((failures + 1))
}
# run NAME EXIT ARGS...: one zero-train job, which must end with EXIT; its output in NAME.log.
run() {
  local name="$1" expected="$2"
  shift 2
  timeout 120 "${launch[@]}" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  [[ $rc -eq $expected ]] || { cat "$work/$name.log"; fail "$name exited $rc, expected $expected"; }
}
# said NAME TEXT: run NAME's output holds TEXT exactly once.
said() {
  local count
  count=$(grep -cF -- "$2" "$work/$1.log")
  [[ $count -eq 1 ]] || { cat "$work/$1.log"; fail "$1: '$2' occurs $count times, expected once"; }
}

mlp="$work/mlp"
run first 0 --steps 4 --save-dir "$mlp" --seed 1
run done 2 --steps 4 --save-dir "$mlp" --resume latest
said done "zero-train: --steps 4: the resumed checkpoint is at step 4, so no step is left to \
train (--steps counts from the run's first step; give more than 4)"
run behind 2 --steps 3 --save-dir "$mlp" --resume latest
said behind "zero-train: --steps 3: the resumed checkpoint is at step 4, so no step is left to \
train (--steps counts from the run's first step; give more than 4)"
run seed 0 --steps 5 --save-dir "$mlp" --resume latest --seed 9
said seed "zero-train: warning: --seed 9 is ignored: a resumed run keeps its checkpoint's seed 1"

gpt2=(--model gpt2 --n-layer 2 --n-head 4 --n-embd 64 --vocab-size 256 --block-size 64
  --seq-len 32 --global-batch 4 --data "$tokens" --val-data "$tokens")
run val_first 0 "${gpt2[@]}" --steps 2 --val-every 2 --save-dir "$work/gpt2"
said val_first "validation: --val-data $tokens holds 1 batch of 4 x 32 tokens, fewer than the \
default --val-batches 4: each validation takes that 1"
run val_resumed 0 "${gpt2[@]}" --steps 3 --val-every 2 --val-batches 1 --save-dir "$work/gpt2" \
  --resume latest
said val_resumed "zero-train: warning: no step of this run (3 to 3) is a multiple of --val-every \
2: it does not validate"

[[ $failures -eq 0 ]] || exit 1
echo "PASS"
