#!/usr/bin/env bash
# Under-load runs (issue 23): two clean clones of COMMIT (default HEAD) under /tmp/load/COMMIT. Stream A runs the
# full suite 3 times in a row; stream B runs the job and election end-to-end files 5 times in a row, then full
# suites as load until A is done. Each stream is the other's load on a 2-core machine. Progress and results:
# /tmp/load/COMMIT/log, each run's output beside it. About 2 hours (a full run is 30-40 minutes under load).
# Start it detached (setsid bench/suite_under_load.sh &); stop it with kill -- -PGID, then SIGINT the pytests.
# Stream B's load runs in one process (-n 0): it is interrupted when A is done, and an interrupted xdist worker is
# killed before its tests' cleanup (agents, namespaces, mounts) finishes; one process runs every finally block.
set -u
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
COMMIT=${1:-$(git -C "$ROOT" rev-parse --short HEAD)}
R=/tmp/load/$COMMIT; rm -rf $R; mkdir -p $R
# The system tools some tests need (.ci/run installs them): without them those tests skip, and a run that skips
# them is not a full run. Each run's skips and their reasons are at the end of its output (-rs).
for t in ip promtool tcpdump chromium iptables; do
  command -v $t >/dev/null 2>&1 || echo "MISSING $t: its tests will skip (run .ci/run's apt-get first)" >> $R/log
done
for s in A B; do
  git clone -q "$ROOT" $R/$s && git -C $R/$s checkout -q $COMMIT
done
setup() { cd $R/$1 && bash .ci/engines >/dev/null 2>&1; python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' >/dev/null 2>&1; echo "$1 setup rc=$? $(date +%T)" >> $R/log; }
setup A & setup B & wait
E2E="tests/test_jobs_cluster.py tests/test_netns_jobs.py tests/test_supervision_cluster.py tests/test_election.py tests/test_netns_election.py tests/test_jobs_level_stops.py tests/test_cpu_work_cluster.py tests/test_operator.py"
(
  cd $R/A
  for i in 1 2 3; do
    echo "A full $i start $(date +%T)" >> $R/log
    timeout 5400 .venv/bin/python -m pytest -q -p no:cacheprovider -rs > $R/A_full_$i.txt 2>&1
    echo "A full $i rc=$? end $(date +%T) $(tail -1 $R/A_full_$i.txt)" >> $R/log
  done
  touch $R/A_done
) &
(
  cd $R/B
  for i in 1 2 3 4 5; do
    echo "B e2e $i start $(date +%T)" >> $R/log
    timeout 3600 .venv/bin/python -m pytest -q -p no:cacheprovider -rs $E2E > $R/B_e2e_$i.txt 2>&1
    echo "B e2e $i rc=$? end $(date +%T) $(tail -1 $R/B_e2e_$i.txt)" >> $R/log
  done
  j=1
  while [ ! -e $R/A_done ]; do
    echo "B load $j start $(date +%T)" >> $R/log
    timeout 5400 .venv/bin/python -m pytest -q -p no:cacheprovider -rs -x -n 0 > $R/B_load_$j.txt 2>&1 &
    p=$!
    while kill -0 $p 2>/dev/null; do [ -e $R/A_done ] && { kill -INT $p; sleep 20; kill -9 -- $p 2>/dev/null; break; }; sleep 10; done
    wait $p; echo "B load $j rc=$? end $(date +%T) $(tail -1 $R/B_load_$j.txt)" >> $R/log
    j=$((j+1))
  done
) &
wait
echo "all done $(date +%T)" >> $R/log
