#!/usr/bin/env bash
# A zero-train --memory-timeline run's files agree with its metrics and trace: the timeline's
# peak is the step records' peak_bytes; at every event the categories sum to the total; where
# the plan is exact (the model state after the last step) they sum to model_state_bytes; the
# trace's "memory total" counter track of rank 0 peaks at the same bytes; the plot is a PNG.
#   memory_timeline_check.sh TIMELINE METRICS TRACE
set -euo pipefail
timeline="$1" metrics="$2" trace="$3"
fail() {
  echo "FAIL: $*"
  exit 1
}
[[ "$(head -1 "$timeline")" == "$(printf 'time_ms\tstep\tcategory\ttier\tdelta_bytes\tcategory_bytes\ttotal_bytes\tphase')" ]] ||
  fail "$timeline has another header"
last_record="$(grep '"event":"step"' "$metrics" | tail -1)"
peak_bytes="$(grep -o '"peak_bytes":[0-9]*' <<<"$last_record" | cut -d: -f2)"
state_bytes="$(grep -o '"model_state_bytes":[0-9]*' <<<"$last_record" | cut -d: -f2)"
read -r peak sum_errors state < <(awk -F'\t' '
  NR == 1 { next }
  {
    held[$3] = $6
    sum = 0
    for (c in held) sum += held[c]
    if (sum != $7) errors++
    if ($7 > peak) peak = $7
  }
  END {
    state = held["params-full"] + held["params-shard"] + held["grads"] + held["master"] + held["optimizer-state"]
    printf "%d %d %d\n", peak, errors, state
  }' "$timeline")
[[ "$peak" == "$peak_bytes" ]] || fail "the timeline peaks at $peak bytes, the step records at $peak_bytes"
[[ "$sum_errors" == 0 ]] || fail "$sum_errors events where the categories do not sum to the total"
[[ "$state" == "$state_bytes" ]] ||
  fail "the model-state categories end at $state bytes, the step record says $state_bytes"
trace_peak="$(grep -o '"ph":"C","pid":0,"name":"memory total","ts":[0-9.]*,"args":{"bytes":[0-9]*' "$trace" |
  grep -o '[0-9]*$' | sort -n | tail -1)"
[[ "$trace_peak" == "$peak_bytes" ]] || fail "the trace's memory total peaks at '$trace_peak', not $peak_bytes"
[[ "$(head -c 8 "$timeline.png" | od -An -tx1 | tr -d ' \n')" == "89504e470d0a1a0a" ]] ||
  fail "$timeline.png is not a PNG"
grep -q "forward " "$timeline" || fail "no event of $timeline has a forward phase"
echo "memory timeline: peak $peak bytes as the step records, categories sum to the total, model state $state bytes as planned"
