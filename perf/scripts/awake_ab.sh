#!/usr/bin/env bash
# One command, alternated with and without idle-priority spinners that keep every vCPU out of
# its halt state (docs/benchmarks.md, "Halted vCPUs: what a wake-up costs").
#
# A spinner is `chrt --idle 0` running a busy loop: SCHED_IDLE, so any runnable thread takes
# its CPU at once, but the vCPU itself never executes HLT and never leaves the guest, so a
# wake-up (an IPI, a disk completion) reaches a running vCPU. What the command gains with the
# spinners is what halting and waking vCPUs cost it. This is a measurement, not a setting for
# production: the spinners keep both cores at 100%.
#
# Usage: perf/scripts/awake_ab.sh [-r ROUNDS] [-n SPINNERS] -- COMMAND [ARGS...]
#   Each round runs COMMAND once "halting" (no spinner) and once "awake" (SPINNERS spinners,
#   default: one per CPU), the order swapped every other round; every line COMMAND prints is
#   prefixed with the round, the mode and the load average before it.
set -euo pipefail
ROUNDS=3
SPINNERS=$(nproc)
while getopts "r:n:" o; do
  case $o in
    r) ROUNDS=$OPTARG ;;
    n) SPINNERS=$OPTARG ;;
    *) echo "usage: $0 [-r ROUNDS] [-n SPINNERS] -- COMMAND [ARGS...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ ${1:-} == -- ]] && shift
(($# > 0)) || { echo "usage: $0 [-r ROUNDS] [-n SPINNERS] -- COMMAND [ARGS...]" >&2; exit 2; }
PIDS=()
stop_spinners() {
  if ((${#PIDS[@]})); then
    kill -KILL "${PIDS[@]}" 2>/dev/null || true
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  fi
  PIDS=()
}
trap stop_spinners EXIT
run() { # mode round
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  if [[ $1 == awake ]]; then
    for _ in $(seq "$SPINNERS"); do
      chrt --idle 0 python3 -c 'while True: pass' &
      PIDS+=($!)
    done
    for p in "${PIDS[@]}"; do # until each spinner runs its loop (bounded: 10 s)
      for _ in $(seq 100); do [[ $(cat /proc/$p/comm 2>/dev/null) == python3 ]] && break; sleep 0.1; done
    done
  fi
  "${CMD[@]}" 2>&1 | sed "s/^/round $2 $1 load $load | /"
  stop_spinners
}
CMD=("$@")
for round in $(seq "$ROUNDS"); do
  if ((round % 2)); then order=(halting awake); else order=(awake halting); fi
  for m in "${order[@]}"; do run "$m" "$round"; done
done
