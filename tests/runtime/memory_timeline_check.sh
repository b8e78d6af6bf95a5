#!/usr/bin/env bash
# A zero-train --memory-timeline run's files agree with its metrics and trace: the timeline's
# peak in the engine's memory is the step records' peak_bytes, and in its pinned and pageable
# host memory their peak_pinned_host_bytes and peak_pageable_host_bytes; at every event a tier's
# categories sum to its total; where the plan is exact (the model state after the last step) the
# engine's sum to model_state_bytes; the trace's "memory total" counter track of rank 0 peaks at
# the engine's peak; the plot is a PNG.
#   memory_timeline_check.sh TIMELINE METRICS TRACE
set -euo pipefail
timeline="$1" metrics="$2" trace="$3"
fail() {
  echo "FAIL: $*"
  exit 1
}
[[ "$(head -1 "$timeline")" == "$(printf 'time_ms\tstep\tcategory\ttier\tdelta_bytes\tcategory_bytes\ttotal_bytes\tphase\tdriver_free_bytes\tdriver_total_bytes')" ]] ||
  fail "$timeline has another header"
last_record="$(grep '"event":"step"' "$metrics" | tail -1)"
field() { grep -o "\"$1\":[0-9]*" <<<"$last_record" | cut -d: -f2; }
peak_bytes="$(field peak_bytes)"
state_bytes="$(field model_state_bytes)"
# Per tier (the engine's is the first event's): its peak and the events whose categories do not
# sum to its total; the model state the engine's tier ends with.
summary="$(awk -F'\t' '
  NR == 1 { next }
  /^#/ { next }
  NR == 2 { engine = $4 }
  {
    held[$4, $3] = $6
    tiers[$4] = 1
    sum = 0
    for (key in held) {
      split(key, part, SUBSEP)
      if (part[1] == $4) sum += held[key]
    }
    if (sum != $7) errors++
    if ($7 > peak[$4]) peak[$4] = $7
  }
  END {
    state = 0
    split("params-full params-shard grads master optimizer-state", model_state, " ")
    for (k in model_state) state += held[engine, model_state[k]]
    printf "errors %d\nstate %d\n", errors, state
    for (t in tiers) printf "peak %d %s%s\n", peak[t], (t == engine ? "engine " : ""), t
  }' "$timeline")"
sum_errors="$(sed -n 's/^errors //p' <<<"$summary")"
state="$(sed -n 's/^state //p' <<<"$summary")"
peak="$(sed -n 's/^peak \([0-9]*\) engine .*/\1/p' <<<"$summary")"
tier_peak() { sed -n "s/^peak \([0-9]*\) $1\$/\1/p" <<<"$summary"; }
[[ "$peak" == "$peak_bytes" ]] || fail "the timeline peaks at $peak bytes, the step records at $peak_bytes"
[[ "$sum_errors" == 0 ]] || fail "$sum_errors events where a tier's categories do not sum to its total"
[[ "$state" == "$state_bytes" ]] ||
  fail "the model-state categories end at $state bytes, the step record says $state_bytes"
# The engine's host allocators, where they held anything: their tiers peak as the step records say.
for tier in pinned pageable; do
  expected="$(field "peak_${tier}_host_bytes")"
  [[ -n "$expected" ]] || fail "the step records have no peak_${tier}_host_bytes"
  [[ "$expected" == 0 ]] && continue
  got="$(tier_peak "$tier host memory")"
  [[ "$got" == "$expected" ]] ||
    fail "the timeline's $tier host memory peaks at '$got' bytes, the step records at $expected"
done
trace_peak="$(grep -o '"ph":"C","pid":0,"name":"memory total","ts":[0-9.]*,"args":{"bytes":[0-9]*' "$trace" |
  grep -o '[0-9]*$' | sort -n | tail -1)"
[[ "$trace_peak" == "$peak_bytes" ]] || fail "the trace's memory total peaks at '$trace_peak', not $peak_bytes"
[[ "$(head -c 8 "$timeline.png" | od -An -tx1 | tr -d ' \n')" == "89504e470d0a1a0a" ]] ||
  fail "$timeline.png is not a PNG"
grep -q "forward " "$timeline" || fail "no event of $timeline has a forward phase"
echo "memory timeline: peak $peak bytes as the step records, categories sum to the total, model state $state bytes as planned"
