#!/usr/bin/env bash
# Runs a job that is meant to fail and checks how it fails:
#   run_fault_job.sh --within SECONDS --binary PATH [--expect REGEX]... -- COMMAND...
# Passes when COMMAND exits non-zero within SECONDS, its output (stdout and stderr) matches
# every extended REGEX, and afterwards no process whose command line starts with PATH is left
# (a stopped or orphaned rank). Leftover processes are listed, killed, and fail the test.
set -uo pipefail

within=""
binary=""
expects=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  case "$1" in
    --within) within="$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    --expect) expects+=("$2"); shift 2 ;;
    *) echo "run_fault_job: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
shift  # the --
if [[ -z "$within" || -z "$binary" || $# -eq 0 ]]; then
  echo "usage: run_fault_job.sh --within SECONDS --binary PATH [--expect REGEX]... -- COMMAND..." >&2
  exit 2
fi

output="$(mktemp)"
trap 'rm -f "$output"' EXIT
start_ns=$(date +%s%N)
# A hard stop well past the bound, so a hung job still ends and gets reported here.
hard_limit=$((within + 30))
timeout -k 5 $hard_limit "$@" >"$output" 2>&1
rc=$?
end_ns=$(date +%s%N)
cat "$output"
elapsed_ms=$(((end_ns - start_ns) / 1000000))
elapsed="$(printf '%d.%03d' $((elapsed_ms / 1000)) $((elapsed_ms % 1000)))"

failed=0
fail() {
  echo "run_fault_job: FAIL: $*" >&2
  failed=1
}
if [[ $rc -eq 0 ]]; then fail "the job exited 0; it was meant to fail"; fi
# Exit codes cannot tell a hang from a death (mpirun itself exits 137 when a rank was killed
# by SIGKILL), so the clock does.
if ((elapsed_ms >= hard_limit * 1000)); then
  fail "the job hung and was killed after ${hard_limit} s"
elif ((elapsed_ms > within * 1000)); then
  fail "the job took ${elapsed} s, more than ${within} s"
fi
for regex in "${expects[@]}"; do
  grep -Eq -- "$regex" "$output" || fail "no line of the output matches: $regex"
done
# Ranks are reaped by mpirun before it exits; allow a moment for the kernel to finish.
left=""
for _ in 1 2 3 4 5; do
  left="$(pgrep -f "^$binary( |$)" || true)"
  [[ -z "$left" ]] && break
  sleep 1
done
if [[ -n "$left" ]]; then
  ps -o pid,stat,args -p "$(echo $left | tr ' ' ,)" >&2 || true
  fail "processes left behind: $(echo $left)"
  for pid in $left; do kill -KILL "$pid" 2>/dev/null || true; done
fi
if [[ $failed -ne 0 ]]; then exit 1; fi
echo "run_fault_job: PASS: exit code $rc after ${elapsed} s (bound ${within} s), nothing left behind"
