# Sourced by this folder's scripts that train the reference GPT-2 (tests/data/gpt2) through
# zero-train, once they have read their own arguments and left the launcher in "$@":
#   mpiexec          the launcher and its flags (empty: zero-train starts as a singleton)
#   data             tests/data/gpt2
#   work             a scratch folder, removed when the script exits
#   reference_model  the zero-train flags of the reference's model, tokens and batch
#   run_logged LOG MESSAGE COMMAND...   runs COMMAND with its output in LOG; when it fails,
#                                       prints LOG and MESSAGE and exits 1
mpiexec=("$@")
data="$(cd "$(dirname "${BASH_SOURCE[0]}")/../data/gpt2" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
reference_model=(--model gpt2 --n-layer 2 --n-head 4 --n-embd 64 --vocab-size 256 --block-size 64
  --seq-len 32 --global-batch 4 --data "$data/tokens.bin")

run_logged() {
  local log="$1" message="$2"
  shift 2
  "$@" > "$log" 2>&1 || { cat "$log"; echo "$message"; exit 1; }
}
