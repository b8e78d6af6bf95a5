#!/usr/bin/env bash
# SIGUSR1 asks a running zero-train for its memory summary: the rank prints the table after the
# step it is in and trains on (the signal's default action would end it).
#   memory_summary_signal.sh ZERO_TRAIN
set -uo pipefail
zero_train="$1"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
"$zero_train" --steps 100000 --steps-per-print 1 >"$out" 2>&1 &
pid=$!
wait_for() {
  for _ in $(seq 300); do
    grep -q "$1" "$out" && return 0
    sleep 0.1
  done
  echo "FAIL: no '$1' in zero-train's output:"
  head -20 "$out"
  kill "$pid"
  exit 1
}
wait_for "^step "
kill -USR1 "$pid"
wait_for "^memory on rank 0 at step [0-9]* (host memory):"
# Still training after the table: a later step line.
step="$(grep -m1 -o "^memory on rank 0 at step [0-9]*" "$out" | grep -o "[0-9]*$")"
wait_for "^step *$((step + 2))/"
kill "$pid"
wait "$pid" 2>/dev/null
grep -A3 "^memory on rank 0 at step" "$out" | head -4
grep -q "category *current *peak *allocs" "$out" || { echo "FAIL: no table header"; exit 1; }
echo "SIGUSR1 printed the memory summary at step $step and training went on"
