#!/usr/bin/env bash
# Stands in for mpirun in the launcher's watchdog test: reports that a rank
# failed, then hangs ignoring SIGTERM, with a child that hangs the same way,
# as a wedged mpirun would. Its last argument (the test's token) marks both
# processes so the test can check that none is left.
token=${*: -1}
trap '' TERM
echo "dsc: rank 3 failed: stuck in a collective" >&2
bash -c 'trap "" TERM; sleep 300' "fake-rank-$token" &
wait
