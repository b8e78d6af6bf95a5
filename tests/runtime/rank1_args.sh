#!/usr/bin/env bash
# Rank 1 gets extra arguments (a wrapper script a user might have written wrongly):
#   rank1_args.sh "EXTRA ARGS" COMMAND [args...]
extra="$1"
shift
if [[ "${OMPI_COMM_WORLD_RANK:-0}" == 1 ]]; then
  # shellcheck disable=SC2086  # the extra arguments are words
  exec "$@" $extra
fi
exec "$@"
