#!/usr/bin/env bash
# A second job on a save directory another job holds is refused at start with exit code 2:
#   save_dir_locked.sh DIR -- COMMAND... (COMMAND uses --save-dir DIR)
set -uo pipefail
dir="$1"
shift 2
rm -rf "$dir" && mkdir -p "$dir"
# The first job: this script, holding zero-train's lock on the directory until it exits.
exec 9>"$dir/.zero-train.lock"
flock -n 9 || { echo "FAIL: cannot take the lock for the test"; exit 1; }
output="$("$@" 2>&1)"
rc=$?
echo "$output"
[[ $rc -eq 2 ]] || { echo "FAIL: exit code $rc, expected 2"; exit 1; }
grep -q "is in use by another job" <<<"$output" || { echo "FAIL: no 'in use' message"; exit 1; }
echo "PASS"
