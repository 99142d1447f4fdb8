#!/bin/sh
# Stand-in package test runner: appends the argv it received to calls-received.log.
log="$(dirname "$0")/calls-received.log"
line=pkgtest
for arg in "$@"; do line="$line [$arg]"; done
# One write per call: parallel runs append whole lines, never interleaved pieces.
printf '%s\n' "$line" 2>/dev/null >>"$log" || echo "note: cannot write $log" >&2
echo "3 tests of package $1 passed."
