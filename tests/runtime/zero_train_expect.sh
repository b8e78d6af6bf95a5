#!/usr/bin/env bash
# Runs a command (zero-train under mpirun) and checks how it ended, so a crash or an early stop
# never passes:
#   zero_train_expect.sh [--exit CODE] [--within SECONDS] [--steps N METRICS] [--once TEXT]...
#                        [--has TEXT]... [--lacks TEXT]... [--file PATH]... -- COMMAND...
#   --exit      the exit code (default 0)
#   --within    the command ends within this many seconds
#   --steps     METRICS holds exactly N step records (written afresh by this run)
#   --once      TEXT occurs in the output exactly once; --has: at least once; --lacks: never
#   --file      PATH exists afterwards
set -uo pipefail
exit_code=0
within=0
steps=""
metrics=""
once=()
has=()
lacks=()
files=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  case "$1" in
    --exit) exit_code="$2"; shift 2 ;;
    --within) within="$2"; shift 2 ;;
    --steps) steps="$2"; metrics="$3"; shift 3 ;;
    --once) once+=("$2"); shift 2 ;;
    --has) has+=("$2"); shift 2 ;;
    --lacks) lacks+=("$2"); shift 2 ;;
    --file) files+=("$2"); shift 2 ;;
    *) echo "zero_train_expect.sh: unknown option $1"; exit 2 ;;
  esac
done
shift
[[ -n "$metrics" ]] && rm -f "$metrics"
start=$SECONDS
output="$("$@" 2>&1)"
rc=$?
elapsed=$((SECONDS - start))
echo "$output"
failures=0
fail() {
  echo "FAIL: $1"
  failures=$((failures + 1))
}
[[ $rc -eq $exit_code ]] || fail "exit code $rc, expected $exit_code"
if [[ $within -gt 0 && $elapsed -gt $within ]]; then
  fail "took ${elapsed}s, expected at most ${within}s"
fi
if [[ -n "$steps" ]]; then
  count=$(grep -c '"event":"step"' "$metrics" 2>/dev/null)
  [[ "$count" == "$steps" ]] || fail "$metrics holds ${count:-no} step records, expected $steps"
fi
for text in "${once[@]}"; do
  count=$(grep -cF -- "$text" <<<"$output")
  [[ $count -eq 1 ]] || fail "'$text' occurs $count times in the output, expected once"
done
for text in "${has[@]}"; do
  grep -qF -- "$text" <<<"$output" || fail "'$text' is not in the output"
done
for text in "${lacks[@]}"; do
  grep -qF -- "$text" <<<"$output" && fail "'$text' is in the output"
done
for path in "${files[@]}"; do
  [[ -e "$path" ]] || fail "$path does not exist"
done
[[ $failures -eq 0 ]] || exit 1
echo "as expected: exit $rc after ${elapsed}s"
