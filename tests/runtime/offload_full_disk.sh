#!/usr/bin/env bash
# With both offloads on one file system, the free-space check counts the optimizer's and the
# parameters' NVMe files together: on a tmpfs with room for either file alone but not for both,
# zero-train stops at start (exit 2) naming both numbers; with room for both it trains. The sizes come
# from zero-estimate's plan of the same config (one rank, the example offload_param config).
# Needs root for a private mount namespace with a small tmpfs; exits 77 (skipped) without.
#   offload_full_disk.sh ZERO_TRAIN ZERO_ESTIMATE CONFIG WORKDIR MPIEXEC [MPIEXEC FLAGS...]
set -euo pipefail
train="$1" estimate="$2" config="$3" work="$4"
shift 4
if [[ "$(id -u)" -ne 0 ]] || ! unshare -m --propagation private true 2>/dev/null; then
  echo "skipped: needs root to mount a small tmpfs in a private mount namespace"
  exit 77
fi
flags=(--model mlp --dtype bf16 --ranks 1 --stage 3 --sub-group-size 1000 --buffer-count 4
  --param-buffer-count 5 --param-buffer-size 100000000)
nvme_of() { "$estimate" "${flags[@]}" "$@" | awk '$1 == 3 && NF == 5 { print $5 }'; }
optimizer="$(nvme_of --offload-optimizer nvme)"
params="$(nvme_of --offload-param nvme)"
both="$(nvme_of --offload-optimizer nvme --offload-param nvme)"
echo "planned nvme bytes: optimizer $optimizer, parameters $params, both $both"
[[ "$both" -eq $((optimizer + params)) ]]
larger=$((optimizer > params ? optimizer : params))
tight=$(((larger + 4095) / 4096 * 4096))  # whole pages: room for the larger file alone
roomy=$(((both + 4095) / 4096 * 4096))
((tight < both)) || { echo "no page-sized room between $larger and $both bytes"; exit 1; }
mkdir -p "$work/fs"
sed "s|/local_nvme|$work/fs|g" "$config" >"$work/full_disk.json"
# SIZE MPIEXEC...: runs zero-train for one step with a tmpfs of SIZE bytes on $work/fs, in its
# own mount namespace (nothing stays mounted).
train_on() {
  local size="$1"
  shift
  unshare -m --propagation private bash -c \
    'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"' _ "$size" "$work/fs" \
    "$@" -np 1 "$train" --config "$work/full_disk.json" --steps 1 2>&1
}
set +e
tight_out="$(train_on "$tight" "$@")"
tight_rc=$?
roomy_out="$(train_on "$roomy" "$@")"
roomy_rc=$?
set -e
echo "--- $tight bytes free (exit $tight_rc):"
echo "$tight_out"
echo "--- $roomy bytes free (exit $roomy_rc):"
echo "$roomy_out"
# Checked at start, before the engine, as a setup error (exit 2), the two files summed.
[[ "$tight_rc" -eq 2 ]]
grep -qF "nvme_path $work/fs: its file system has $tight bytes" <<<"$tight_out"
grep -qF "but the 1 rank(s) on this node write $both bytes" <<<"$tight_out"
[[ "$roomy_rc" -eq 0 ]]
grep -qF "of optimizer state and parameters under $work/fs" <<<"$roomy_out"
