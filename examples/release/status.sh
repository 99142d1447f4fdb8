#!/bin/sh
# Stand-in status probe: appends the argv it received to calls-received.log.
log="$(dirname "$0")/calls-received.log"
{ printf 'status'; for arg in "$@"; do printf ' [%s]' "$arg"; done; printf '\n'; } >>"$log"
echo "Service $1: running, 3 instances healthy."
