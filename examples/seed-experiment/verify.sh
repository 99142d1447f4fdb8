#!/bin/sh
# A run succeeds only when the script really ran, once, with exactly the expected arguments:
# compare what the scripts logged with the one expected line, then clear the log for the next run.
# A check runs in the agent file's folder from a copy mm-batch read at start, so the log is found
# from the working directory, not from where this script lies.
log="calls-received.log"
got="$(cat "$log" 2>/dev/null)"
rm -f "$log"
if [ "$got" = "$1" ]; then
    exit 0
fi
echo "expected: $1"
echo "received: ${got:-nothing}"
exit 1
