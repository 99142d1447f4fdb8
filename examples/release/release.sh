#!/bin/sh
# Stand-in release script: appends the argv it received to calls-received.log, one entry per
# [bracket], so that a run can be checked against what really ran.
log="$(dirname "$0")/calls-received.log"
{ printf 'release'; for arg in "$@"; do printf ' [%s]' "$arg"; done; printf '\n'; } >>"$log"
echo "Released version $1 (${2#--channel=} channel)."
