#!/usr/bin/env bash
# NVMe files in a directory others can write: every name a run of 2 ranks could give a file there
# (the spill's activations_rank_<r>.bin, the offloads' zero_optimizer_rank<r>.<pid>.swp and
# zero_param_rank<r>.<pid>.swp, the start-up probe's .zero_nvme_probe_<host>_<pid>, for the next
# pids the system hands out) is planted as a symbolic link to one file. A GPT-2 run at stage 3
# with both offloads and its activation checkpoints there trains, and leaves that file and the
# directory as they were.
#   nvme_planted_links.sh ZERO_TRAIN DATA CONFIG WORKDIR MPIEXEC [MPIEXEC FLAGS...]
set -euo pipefail
train="$1" data="$2" config="$3" work="$4"
shift 4
rm -rf "$work" && mkdir -p "$work/nvme"
text="not the run's to touch"
echo "$text" >"$work/target"
# One sequence per rank and step: the test's token file is short.
sed -e "s|/local_nvme|$work/nvme|g" -e 's|"train_micro_batch_size_per_gpu": 6|"train_micro_batch_size_per_gpu": 1|' \
  -e 's|"gradient_accumulation_steps": 2|"gradient_accumulation_steps": 1|' "$config" >"$work/config.json"
window=4000
first="$(cat /proc/sys/kernel/ns_last_pid)"
python3 - "$work/nvme" "$work/target" "$first" "$window" "$(cat /proc/sys/kernel/pid_max)" <<'EOF'
import os, socket, sys
nvme, target = sys.argv[1], sys.argv[2]
first, window, pid_max = map(int, sys.argv[3:])
host = socket.gethostname()
names = [f"activations_rank_{r}.bin" for r in (0, 1)]
for i in range(1, window + 1):
    pid = first + i if first + i < pid_max else 300 + first + i - pid_max  # pids wrap to 300
    names += [f"zero_{kind}_rank{r}.{pid}.swp" for kind in ("optimizer", "param") for r in (0, 1)]
    names.append(f".zero_nvme_probe_{host}_{pid}")
for name in names:
    os.symlink(target, os.path.join(nvme, name))
EOF
before="$(ls -A "$work/nvme" | md5sum)"
set +e
out="$("$@" -np 2 "$train" --model gpt2 --n-layer 2 --n-head 4 --n-embd 64 --vocab-size 256 \
  --block-size 64 --seq-len 32 --global-batch 2 --steps 2 --data "$data" \
  --activation-checkpointing full --checkpoint-nvme-path "$work/nvme" \
  --config "$work/config.json" 2>&1)"
rc=$?
set -e
last="$(cat /proc/sys/kernel/ns_last_pid)"
echo "$out"
fail() { echo "nvme_planted_links: FAIL: $*" >&2; exit 1; }
[[ "$rc" -eq 0 ]] || fail "zero-train exited $rc"
grep -q "nvme per rank: .* under $work/nvme" <<<"$out" || fail "the offloads did not use $work/nvme"
grep -q "step     2/2" <<<"$out" || fail "the run did not train"
[[ "$(cat "$work/target")" == "$text" ]] || fail "the planted links' target was written through"
[[ "$(ls -A "$work/nvme" | md5sum)" == "$before" ]] || fail "the directory's names changed"
if ((last >= first && last - first >= window)); then
  fail "inconclusive: $((last - first)) pids were handed out since planting, $window were planted"
fi
echo "nvme_planted_links: PASS: no planted link was followed and no name was left"
