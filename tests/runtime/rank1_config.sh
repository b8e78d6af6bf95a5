#!/usr/bin/env bash
# A config file only one rank can read: rank 1 runs zero-train with --config BAD, every other
# rank with --config GOOD (OpenMPI's rank variable).
#   rank1_config.sh ZERO_TRAIN GOOD BAD [zero-train args...]
zero_train="$1"
good="$2"
bad="$3"
shift 3
config="$good"
[[ "${OMPI_COMM_WORLD_RANK:-0}" == 1 ]] && config="$bad"
exec "$zero_train" --config "$config" "$@"
