#!/usr/bin/env bash
# The main job: set-up, build, then train a small GPT-2 with ZeRO-3 on 2 ranks through the
# zerorun launcher, on English text the set-up installs (the `fortunes` package, about 2.6 MB),
# tokenized byte by byte (vocabulary 256). It prints the training loss every 10 steps and the
# validation loss every 50; it falls from ln(256) = 5.55 to about 2.6 in a few minutes on 2 cores.
# Extra arguments go to zero-train (e.g. --steps 600 --stage 2).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZERO_BUILD_DIR:-$root/build}"

bash "$root/scripts/build.sh"
data="$build/data"
mkdir -p "$data"
if [ ! -f "$data/fortunes_train.bin" ]; then
  # The text files of the package: not the .dat indexes, nor the .u8 links to the same text.
  texts=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
  # shellcheck disable=SC2086
  "$build/bin/zero-tokenize" $texts --out "$data/fortunes_train.bin" \
    --val-out "$data/fortunes_val.bin" --val-fraction 0.05
fi
exec "$build/bin/zerorun" -np 2 -- "$build/bin/zero-train" --model gpt2 --preset tiny \
  --seq-len 64 --global-batch 16 --stage 3 --steps 300 --lr 1e-3 --weight-decay 0.1 \
  --schedule cosine --warmup 20 --clip 1.0 --steps-per-print 10 \
  --data "$data/fortunes_train.bin" --val-data "$data/fortunes_val.bin" --val-every 50 \
  --val-batches 8 "$@"
