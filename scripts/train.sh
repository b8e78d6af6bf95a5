#!/usr/bin/env bash
# The main job: set-up, build, then train the example MLP with ZeRO-3 on 2 ranks through the
# zerorun launcher. Extra arguments go to zero-train (e.g. --steps 200 --stage 2).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZERO_BUILD_DIR:-$root/build}"

bash "$root/scripts/build.sh"
exec "$build/bin/zerorun" -np 2 -- "$build/bin/zero-train" --model mlp --stage 3 --steps 50 "$@"
