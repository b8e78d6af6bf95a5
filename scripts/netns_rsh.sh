#!/usr/bin/env bash
# OpenMPI's remote-launch agent (plm_rsh_agent) for the nodes of netns_cluster.sh: mpirun calls
# it as it would call ssh, `netns_rsh.sh HOST WORDS...`, to start its daemon (orted) on HOST,
# and it runs the words as one shell command inside HOST's namespaces. As over ssh, the command
# starts with a clean environment (only what finds OpenMPI's programs and libraries), so the
# ranks get mpirun's settings and zerorun's forwarded variables the way they would on a cluster.
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: netns_rsh.sh HOST COMMAND..." >&2; exit 2; }
host="$1"
shift
environment=(PATH="$PATH" HOME="${HOME:-/}")
for name in LD_LIBRARY_PATH OPAL_PREFIX; do
  if [[ -n "${!name:-}" ]]; then environment+=("$name=${!name}"); fi
done
exec bash "$(dirname "${BASH_SOURCE[0]}")/netns_cluster.sh" exec "$host" \
  env -i "${environment[@]}" /bin/sh -c "$*"
