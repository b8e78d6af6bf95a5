#!/usr/bin/env bash
# zero-estimate --model plans the same bytes the engine then allocates:
#   estimate_matches_engine.sh ZERO_ESTIMATE METRICS.jsonl RANKS STAGE [MODEL FLAGS...]
# METRICS is the metrics file of a zero-train run at RANKS ranks and STAGE with its defaults
# and the model flags given (default: --model mlp; later flags override --dtype fp32); its init
# record's model_state_bytes, buffer_bytes and nvme_bytes must equal the estimate's row.
set -euo pipefail
estimate="$1" metrics="$2" ranks="$3" stage="$4"
shift 4
model=(--model mlp)
if [[ $# -gt 0 ]]; then model=("$@"); fi
# The table's row of that stage (lines after it describe the tiers).
row="$("$estimate" --dtype fp32 "${model[@]}" --ranks "$ranks" --stage "$stage" |
  awk -v stage="$stage" '$1 == stage && NF == 5')"
[[ -n "$row" ]] || { echo "no row for stage $stage in the estimate" >&2; exit 1; }
read -r _ planned_state planned_buffers _ planned_nvme <<<"$row"
init="$(grep '"event":"init"' "$metrics")"
measured_state="$(sed -E 's/.*"model_state_bytes":([0-9]+).*/\1/' <<<"$init")"
measured_buffers="$(sed -E 's/.*"buffer_bytes":([0-9]+).*/\1/' <<<"$init")"
measured_nvme="$(sed -E 's/.*"nvme_bytes":([0-9]+).*/\1/' <<<"$init")"
echo "planned: state $planned_state, buffers $planned_buffers, nvme $planned_nvme"
echo "engine:  state $measured_state, buffers $measured_buffers, nvme $measured_nvme"
[[ "$planned_state" == "$measured_state" && "$planned_buffers" == "$measured_buffers" &&
  "$planned_nvme" == "$measured_nvme" ]]
