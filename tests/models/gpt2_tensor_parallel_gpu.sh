#!/usr/bin/env bash
# The GPT-2's tensor parallelism on GPUs: gpt2_tensor_parallel.sh (t = 2 on 2 ranks, stages 0-3,
# against --tp 1 and PyTorch within TOLERANCE, with its traffic and activation formulas) with
# --device cuda, each rank on its own GPU through NCCL. NCCL needs a GPU per rank, so with
# fewer than 2 GPUs this skips, saying so.
#   gpt2_tensor_parallel_gpu.sh BIN_DIR TOLERANCE -- MPIEXEC [FLAGS...]
set -euo pipefail
bin="$1"; tolerance="$2"; shift 2
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c "^GPU " || true)
if [ "$gpus" -lt 2 ]; then
  echo "gpt2_tensor_parallel_gpu: skipping (NCCL needs a GPU per rank: $gpus GPU(s) here, 2 needed)"
  exit 0
fi
exec bash "$(dirname "${BASH_SOURCE[0]}")/gpt2_tensor_parallel.sh" "$bin" 2 2 "$tolerance" \
  --device cuda "$@"
