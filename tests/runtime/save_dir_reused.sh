#!/usr/bin/env bash
# A save directory that holds a run's checkpoints is never overwritten by surprise:
#   save_dir_reused.sh WORKDIR -- LAUNCH... (LAUNCH: mpirun ... zero-train)
# 1. a run saves steps 2 and 4 in D; 2. a new run on D without --resume is refused at start with
# exit code 2, naming step 4 and --resume, and leaves D as it was; 3. a resume of another run's
# checkpoint into D is refused alike; 4. a resume of D's step 2 trains, saying once that D holds
# steps up to 4 and that `latest` moves back to this run's saves.
set -uo pipefail
work="$1"
shift 2
launch=("$@")
rm -rf "$work" && mkdir -p "$work"
dir="$work/run"
failures=0
fail() {
  echo "FAIL: $1"
  failures=$((failures + 1))
}
# run NAME ARGS...: one zero-train job; its output in $work/NAME.log, its exit code in $rc.
run() {
  local name="$1"
  shift
  timeout 120 "${launch[@]}" "$@" >"$work/$name.log" 2>&1
  rc=$?
}
# said NAME COUNT TEXT: run NAME's output holds TEXT exactly COUNT times.
said() {
  local count
  count=$(grep -cF -- "$3" "$work/$1.log")
  [[ $count -eq $2 ]] || { cat "$work/$1.log"; fail "$1: '$3' occurs $count times, expected $2"; }
}

run first --steps 4 --save-dir "$dir" --save-every 2 --seed 1
[[ $rc -eq 0 ]] || { cat "$work/first.log"; fail "the first run exited $rc"; exit 1; }
before="$(cat "$dir/latest"; sha256sum "$dir"/step_*/*)"

run fresh --steps 2 --save-dir "$dir" --seed 2
[[ $rc -eq 2 ]] || fail "a new run on a used --save-dir exited $rc, expected 2"
said fresh 1 "zero-train: --save-dir $dir already holds checkpoints up to step 4; pass --resume \
latest to continue that run, or choose another --save-dir"
[[ "$(cat "$dir/latest"; sha256sum "$dir"/step_*/*)" == "$before" ]] ||
  fail "the refused run changed $dir"

run other --steps 2 --save-dir "$work/other" --seed 3
[[ $rc -eq 0 ]] || { cat "$work/other.log"; fail "the other run exited $rc"; }
run mixed --steps 4 --save-dir "$dir" --resume "$work/other"
[[ $rc -eq 2 ]] || fail "a resume of another run into a used --save-dir exited $rc, expected 2"
said mixed 1 "zero-train: --save-dir $dir already holds checkpoints up to step 4, and --resume \
$work/other is not one of them; resume with --resume latest, or choose another --save-dir"

run older --steps 3 --save-dir "$dir" --resume "$dir/step_00000002"
[[ $rc -eq 0 ]] || fail "a resume of an older step of $dir exited $rc, expected 0"
said older 1 "zero-train: warning: --save-dir $dir holds checkpoints up to step 4 and this run \
resumed step 2: its saves replace those of the steps it reaches, and latest moves back to them"
[[ "$(cat "$dir/latest")" == step_00000003 ]] || fail "latest is '$(cat "$dir/latest")', expected step_00000003"

[[ $failures -eq 0 ]] || exit 1
echo "PASS"
