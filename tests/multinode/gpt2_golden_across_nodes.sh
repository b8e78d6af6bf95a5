#!/usr/bin/env bash
# The GPT-2 golden test (tests/models/gpt2_golden.sh: stages 0-3 against PyTorch and against
# stage 0) with its 4 ranks on 2 nodes, launched by zerorun from the cluster's hostfile. Each
# node must have received at least half of the model's gradients (120,576 fp32 parameters) per
# step over its link: 4 stages x 3 steps x 241,152 bytes; a job that stayed on one node moves
# only a few KB there.
#   gpt2_golden_across_nodes.sh BIN_DIR
set -euo pipefail
bin="$1"
here="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=SCRIPTDIR/cluster_lib.sh
source "$here/cluster_lib.sh"

start_cluster 2
before0="$(link_bytes node0)"
before1="$(link_bytes node1)"
on_cluster bash "$here/../models/gpt2_golden.sh" "$bin" 4 -- "$bin/zerorun" --hostfile "$hostfile"
at_least=$((4 * 3 * 120576 * 4 / 2))
expect_received node0 "$before0" "$at_least"
expect_received node1 "$before1" "$at_least"
