#!/bin/sh
# A run passes only when exactly one tool ran, once, with exactly the expected argv: compare the
# log the scripts wrote with the one expected line, then clear it for the next run (the set runs
# one task at a time: jobs: 1). A check runs from a copy mm-batch read at start, in the agent
# file's folder, so the log is found from the working directory.
log="heldout-received.log"
got="$(cat "$log" 2>/dev/null)"
rm -f "$log"
if [ "$got" = "$1" ]; then
    exit 0
fi
echo "expected: $1"
echo "received: ${got:-nothing}"
exit 1
