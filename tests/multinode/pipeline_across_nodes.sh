#!/usr/bin/env bash
# The reference GPT-2 cut into a pipeline of 2 stages, one stage per node (2 nodes of 1 slot,
# zerorun --pp 2), against the same job on one node and against what should cross the links.
#  1. Every step's loss and gradient norm equal the one-node job's bit for bit: placement
#     changes where the ranks run, not what they compute.
#  2. The bytes each node receives over its link per step are the payload below, within 10 %
#     above it for TCP/IP framing and never below it. Two jobs of 2 and 10 steps are measured and
#     the difference taken over the 8 extra steps, so start-up traffic (launch, wire-up, the
#     grid's splits and agreements, the first step's extras) cancels.
# Per step each node receives from the other stage (payload, bytes):
#   activations or gradients  pp_comm_bytes / 2: each micro-batch's activation [2, 32, 64] fp32
#                             goes to stage 1, its gradient back to stage 0 (pp_comm_bytes, the
#                             metrics' count, is both ways: 2 micro-batches x 2 x 16,384 = 65,536)
#   tied wte's gradient sum   256 x 64 x 4 = 65,536. The tie group is one rank on each node, so
#                             zero's collectives take the hierarchical path: an all-to-all of
#                             halves (each rank sends the other the half it sums) and an
#                             all-gather of the summed halves, n/2 + n/2 = n bytes each way. No
#                             all-reduce between 2 ranks can move less (each rank's result
#                             depends on all n bytes of the other's), and MPI's own (recursive
#                             doubling, or reduce-scatter and all-gather) moves exactly n too:
#                             with ZERO_COLLECTIVES=mpi the links carried the same bytes.
#   gradient norm             8: the stage's sum of squares (a double), all-gathered over the
#                             pipeline
#   step figures              56: zero-train's RankFigures (7 x 8 bytes), all-gathered over the
#                             world for the step record
# = 98,368 bytes per node per step, two thirds of it the tie's sum.
# Framing: with the veth links' segmentation offload (the default) TCP sends messages in super-
# packets of up to 64 KB whose headers count once: measured 0.5-1.0 % above the payload. With
# 1500-byte segments (gso_max_size 1500 on both ends of each link) every 1,448 bytes carry 66
# bytes of Ethernet, IP and TCP headers (4.6 %) and an ACK of 66 bytes comes back about every
# other segment (2.3 %): measured 5.6-8.0 %. 10 % holds either way.
#   pipeline_across_nodes.sh BIN_DIR
set -euo pipefail
bin="$1"
data="$(cd "$(dirname "${BASH_SOURCE[0]}")/../data/gpt2" && pwd)"
# shellcheck source=SCRIPTDIR/cluster_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster_lib.sh"

start_cluster 2 1

# train NAME STEPS LAUNCHER...: a pipelined job of STEPS steps; output in $work/NAME.log and
# its metrics in $work/NAME.jsonl.
train() {
  local name="$1" steps="$2"
  shift 2
  run_job "$name" "$@" -np 2 --pp 2 -- "$bin/zero-train" --model gpt2 \
    --config "$data/adamw.json" --pp 2 --n-layer 2 --n-head 4 --n-embd 64 --vocab-size 256 \
    --block-size 64 --seq-len 32 --global-batch 4 --micro-batches 2 --steps "$steps" \
    --data "$data/tokens.bin" --init-from "$data/model.safetensors" --metrics "$work/$name.jsonl"
}

# measure NAME STEPS: the job on the two nodes; sets `received`, the bytes node0 and node1
# received over their links during it.
measure() {
  local before0 before1
  before0="$(link_bytes node0)"
  before1="$(link_bytes node1)"
  train "$1" "$2" on_cluster "$bin/zerorun" --hostfile "$hostfile"
  received=($(($(link_bytes node0) - before0)) $(($(link_bytes node1) - before1)))
}

# 1. The same job on one node (this host, shared memory) and on two.
train one_node 10 "$bin/zerorun"
measure short 2
short=("${received[@]}")
measure long 10
# Each step's loss and norm as Python writes the doubles back: equal text is equal bits.
steps() {
  python3 -c 'import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if r["event"] == "step":
        print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))' "$1"
}
if [ "$(steps "$work/one_node.jsonl")" != "$(steps "$work/long.jsonl")" ]; then
  diff <(steps "$work/one_node.jsonl") <(steps "$work/long.jsonl") || true
  echo "FAIL: the job across the nodes did not train as on one node (step, loss, norm above)"
  exit 1
fi
echo "10 steps across the nodes equal to one node bit for bit; step, loss, grad norm:"
steps "$work/long.jsonl"

# 2. The bytes per step against the formula.
activation_bytes=$((2 * 2 * 2 * 32 * 64 * 4))  # both ways x 2 micro-batches x [2, 32, 64] fp32
pp_comm_bytes="$(python3 -c 'import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r["event"] == "step"]
print(sorted({r["pp_comm_bytes"] for r in steps}))' "$work/long.jsonl")"
if [ "$pp_comm_bytes" != "[$activation_bytes]" ]; then
  echo "FAIL: pp_comm_bytes per step $pp_comm_bytes, expected [$activation_bytes]"
  exit 1
fi
tie_bytes=$((256 * 64 * 4))
norm_bytes=8
figures_bytes=56
payload=$((activation_bytes / 2 + tie_bytes + norm_bytes + figures_bytes))
extra_steps=8
echo "payload per node per step: $((activation_bytes / 2)) activations or gradients +" \
  "$tie_bytes tied wte + $norm_bytes norm + $figures_bytes step figures = $payload"
for node in 0 1; do
  extra=$((received[node] - short[node]))
  above="$(python3 -c "print(f'{($extra / $extra_steps / $payload - 1) * 100:+.2f}')")"
  echo "node$node received ${short[node]} bytes in 2 steps, ${received[node]} in 10:" \
    "$((extra / extra_steps)) per step, $above % on the payload"
  at_least=$((extra_steps * payload)) at_most=$((extra_steps * payload * 11 / 10))
  if [[ $extra -lt $at_least || $extra -gt $at_most ]]; then
    echo "FAIL: node$node received $extra bytes in $extra_steps steps;" \
      "expected $at_least to $at_most (the payload, up to 10 % above it)"
    exit 1
  fi
done
