#!/usr/bin/env bash
# Shared by the job scripts (source it; submit from the repository root).
# run_and_requeue REQUEUE_CMD... -- LAUNCH_CMD...
#   Runs LAUNCH_CMD (srun/yhrun/mpiexec pipetrain ...) and keeps its output. When pipetrain
#   exited 0 with "stopped:" (a signal ahead of the time limit made it checkpoint and stop),
#   runs REQUEUE_CMD so the job starts again and resumes from the newest checkpoint.
#   Returns pipetrain's exit code otherwise (0 done; 2 bad input; 3 checkpoint; 4 non-finite;
#   5 hang: none of these is requeued, they need a person).
run_and_requeue() {
  local requeue=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do
    requeue+=("$1")
    shift
  done
  shift
  local log rc
  log=$(mktemp)
  set +e
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  if [[ $rc -eq 0 ]] && grep -q '^stopped:' "$log"; then
    echo "== $(date -Is) stopped before the end of training: requeueing (${requeue[*]})"
    rm -f "$log"
    "${requeue[@]}"
    return 0
  fi
  rm -f "$log"
  return "$rc"
}

# Slurm may send the warning signal the moment a (requeued) job's tasks start, before pipetrain
# has blocked it: tasks start through this wrapper, which ignores SIGUSR1 until pipetrain's main()
# takes over (an ignored disposition survives exec). A signal lost that way only means the run
# goes on until the next one, or until the SIGTERM at the time limit, which stops it the same way.
# shellcheck disable=SC2034 # used by the job scripts that source this file
PT_TASK_WRAPPER=(bash -c 'trap "" USR1; exec "$@"' pipetrain-task)

# usage_if_no_deck "$@": every script takes the deck first, then section.key=value overrides
usage_if_no_deck() {
  if [[ $# -lt 1 ]]; then
    echo "usage: submit this script with: DECK [section.key=value ...]" >&2
    exit 2
  fi
}

# threads_per_rank N: the OpenMP environment of ranks of N threads each (pipetrain reads
# OMP_NUM_THREADS when device.threads is 0; OMP_PLACES/OMP_PROC_BIND keep each thread on one
# core of its rank's). The launcher must give every rank N cores (docs/running.md); pipetrain's
# layout table shows each rank's cores and warns when they are fewer than its threads.
threads_per_rank() {
  export OMP_NUM_THREADS="$1" OMP_PLACES=cores OMP_PROC_BIND=close
}
