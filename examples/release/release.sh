#!/bin/sh
# Stand-in release script: appends the argv it received to calls-received.log, one entry per
# [bracket], so that a run can be checked against what really ran.
log="$(dirname "$0")/calls-received.log"
line=release
for arg in "$@"; do line="$line [$arg]"; done
# One write per call: parallel runs append whole lines, never interleaved pieces.
printf '%s\n' "$line" 2>/dev/null >>"$log" || echo "note: cannot write $log" >&2
echo "Released version $1 (${2#--channel=} channel)."
