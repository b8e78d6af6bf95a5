#!/usr/bin/env bash
# Checkpoints of a tensor-parallel run of the reference GPT-2 (tests/data/gpt2): a run at
# tensor-parallel 2 x data-parallel NP/2, stage 3, saved after step 2 and resumed, gives the
# uninterrupted run's steps 3-4 bit for bit; resumed at tensor-parallel 2 x data-parallel 1 it
# matches them within 1e-5 (the data-parallel reductions sum in another order); each rank's
# manifest records the grid; a resume at another tensor-parallel size, in either direction, and
# an export of one rank's slices are refused with messages that say why.
#   gpt2_tensor_parallel_resume.sh BIN_DIR NP -- MPIEXEC [FLAGS...]
set -euo pipefail
bin="$1"; np="$2"; shift 3
mpiexec=("$@")
data="$(cd "$(dirname "${BASH_SOURCE[0]}")/../data/gpt2" && pwd)"
work="$(mktemp -d)"
init="$data/model.safetensors"
trap 'rm -rf "$work"' EXIT

# train NAME RANKS TP [FLAGS...]: a zero-train run; its output in NAME.log, its exit code in $rc.
# Fresh runs start from the reference weights (--init-from "$init").
train() {
  local run="$work/$1" ranks="$2" split="$3"
  shift 3
  rc=0
  "${mpiexec[@]}" -np "$ranks" "$bin/zero-train" --model gpt2 --config "$data/adamw.json" \
    --stage 3 --tp "$split" \
    --n-layer 2 --n-head 4 --n-embd 64 --vocab-size 256 --block-size 64 --seq-len 32 \
    --global-batch 4 --steps 4 --data "$data/tokens.bin" --metrics "$run.jsonl" "$@" > "$run.log" 2>&1 || rc=$?
}
ok() { if [ "$rc" -ne 0 ]; then cat "$work/$1.log"; echo "FAIL: run $1 exited $rc"; exit 1; fi; }
# refused NAME TEXT: the run failed, saying TEXT.
refused() {
  if [ "$rc" -eq 0 ] || ! grep -qF -- "$2" "$work/$1.log"; then
    cat "$work/$1.log"; echo "FAIL: run $1 (exit $rc) should have been refused with: $2"; exit 1
  fi
  echo "refused as expected: $2"
}
# same_steps A B TOLERANCE: steps 3-4 of run B (resumed) against run A, relative.
same_steps() {
  python3 - "$work/$1.jsonl" "$work/$2.jsonl" "$3" <<'PY'
import json, sys
def steps(path):
    return {r["step"]: r for r in map(json.loads, open(path)) if r["event"] == "step"}
a, b, tolerance = steps(sys.argv[1]), steps(sys.argv[2]), float(sys.argv[3])
for s in (3, 4):
    for key in ("loss", "grad_norm"):
        x, y = a[s][key], b[s][key]
        if abs(x - y) > tolerance * abs(x):
            sys.exit(f"FAIL step {s} {key}: {y}, the uninterrupted run {x}")
print(f"steps 3-4 of {sys.argv[2]} match within {tolerance}")
PY
}

save="$work/ckpt"
train whole "$np" 2 --init-from "$init"; ok whole
train first "$np" 2 --steps 2 --save-dir "$save" --init-from "$init"; ok first
# The manifest's text format leaves out zeros: rank 0's has no tensor_parallel_rank line.
for r in 0 1; do
  manifest="$save/tp_rank_0$r/step_00000002/manifest.pbtxt"
  rank_line="$(grep "^tensor_parallel_rank:" "$manifest" || echo "tensor_parallel_rank: 0")"
  if ! grep -q "^tensor_parallel_size: 2$" "$manifest" || [ "$rank_line" != "tensor_parallel_rank: $r" ]; then
    cat "$manifest"; echo "FAIL: $manifest does not record the grid"; exit 1
  fi
done
train resumed "$np" 2 --resume "$save"; ok resumed
same_steps whole resumed 0
if [ "$np" -gt 2 ]; then
  train fewer 2 2 --resume "$save"; ok fewer
  same_steps whole fewer 1e-5
fi

train at_tp1 $((np / 2)) 1 --resume "$save"
refused at_tp1 "was saved by a tensor-parallel run"
refused at_tp1 "resharding across tensor-parallel sizes (splitting or merging each slice) is not built yet"
train plain $((np / 2)) 1 --steps 2 --save-dir "$work/plain" --init-from "$init"; ok plain
train from_tp1 "$np" 2 --resume "$work/plain"
refused from_tp1 "it was not saved by a run with tensor-parallel size 2"
rc=0
"$bin/zero-checkpoint" export "$save/tp_rank_00" --to "$work/slices.safetensors" \
  > "$work/export.log" 2>&1 || rc=$?
refused export "merging the ranks' slices into the full model is not built yet"
