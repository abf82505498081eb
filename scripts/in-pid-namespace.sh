#!/usr/bin/env bash
# Runs a command in a PID namespace of its own where the system allows one (as root, or as a
# user through a user namespace), else as it is, saying so. The mutants scripts run in one: a
# mutant may turn a process id into 0 or -1 (the launcher signals process trees), and kill(2) then
# signals a group or every process of the user; in the namespace it reaches only the tests.
#
#   scripts/in-pid-namespace.sh COMMAND [ARG...]
set -euo pipefail
for ns in "unshare --pid --fork --mount-proc" "unshare --user --map-root-user --pid --fork --mount-proc"; do
  if $ns true 2>/dev/null; then exec env ZB_IN_PID_NAMESPACE=1 $ns "$@"; fi
done
echo "$(basename "$1"): no PID namespace here; running without one" >&2
exec env ZB_IN_PID_NAMESPACE=1 "$@"
