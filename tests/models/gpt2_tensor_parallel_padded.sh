#!/usr/bin/env bash
# A vocabulary that does not divide over the tensor-parallel ranks is padded: the reference
# GPT-2 (tests/data/gpt2) with one more token (257, wte's row 257 half of row 0's values) trained
# at --tp 2 on 2 ranks (129 rows of wte each, the last a zero row whose logit the cross-entropy
# leaves out) against --tp 1 on 1 rank, stages 0 and 3: every step's loss, gradient norm and
# validation loss within 1e-5 relative.
#   gpt2_tensor_parallel_padded.sh BIN_DIR -- MPIEXEC [FLAGS...]
set -euo pipefail
bin="$1"; shift 2
mpiexec=("$@")
data="$(cd "$(dirname "${BASH_SOURCE[0]}")/../data/gpt2" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 - "$data/model.safetensors" "$work/model257.safetensors" <<'PY'
import json, struct, sys
src = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", src[:8])[0]
header = json.loads(src[8:8 + n])
body = src[8 + n:]
tensors = {k: v for k, v in header.items() if k != "__metadata__"}
out_header, out_body = {}, b""
for name, entry in sorted(tensors.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    begin, end = entry["data_offsets"]
    data = body[begin:end]
    shape = list(entry["shape"])
    if name == "wte.weight":
        row0 = struct.unpack(f"<{shape[1]}f", data[:4 * shape[1]])
        data += struct.pack(f"<{shape[1]}f", *(0.5 * v for v in row0))
        shape[0] += 1
    out_header[name] = {"dtype": entry["dtype"], "shape": shape,
                        "data_offsets": [len(out_body), len(out_body) + len(data)]}
    out_body += data
text = json.dumps(out_header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + out_body)
PY
train() {
  local stage="$1" ranks="$2" split="$3" run="$work/$4"
  "${mpiexec[@]}" -np "$ranks" "$bin/zero-train" --model gpt2 --config "$data/adamw.json" \
    --stage "$stage" --tp "$split" \
    --n-layer 2 --n-head 4 --n-embd 64 --vocab-size 257 --block-size 64 --seq-len 32 \
    --global-batch 4 --steps 3 --data "$data/tokens.bin" --init-from "$work/model257.safetensors" \
    --val-data "$data/tokens.bin" --val-every 1 --val-batches 1 \
    --metrics "$run.jsonl" > "$run.log" 2>&1 || {
    cat "$run.log"; echo "zero-train failed at stage $stage on $ranks rank(s), --tp $split"; exit 1; }
}
for stage in 0 3; do
  train "$stage" 1 1 "plain$stage"
  train "$stage" 2 2 "split$stage"
  python3 - "$work/plain$stage.jsonl" "$work/split$stage.jsonl" "$stage" <<'PY'
import json, sys
def steps(path):
    return [r for r in map(json.loads, open(path)) if r["event"] == "step"]
init = next(r for r in map(json.loads, open(sys.argv[2])) if r["event"] == "init")
block = 2 * 64 + 64 * 96 + 96 + 32 * 64 + 64 + 2 * 64 + 64 * 128 + 128 + 128 * 64 + 64
if init["params"] != 129 * 64 + 64 * 64 + 2 * 64 + 2 * block:
    sys.exit(f"FAIL a rank holds {init['params']} parameters, not its padded slices")
worst = 0.0
for a, b in zip(steps(sys.argv[1]), steps(sys.argv[2])):
    for key in ("loss", "grad_norm", "val_loss"):
        difference = abs(a[key] - b[key]) / abs(a[key])
        worst = max(worst, difference)
        if difference > 1e-5:
            sys.exit(f"FAIL step {a['step']} {key}: {b[key]} at --tp 2, {a[key]} at --tp 1")
print(f"stage {sys.argv[3]}: vocabulary 257 at --tp 2 matches --tp 1 (largest difference {worst:.3g})")
PY
done
