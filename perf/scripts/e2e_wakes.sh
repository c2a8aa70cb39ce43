#!/usr/bin/env bash
# Thread wake-ups per message in the e2e phase of an embedded open-loop mqperf run, by waking
# thread and kernel path (perf record of sched:sched_waking, started 4.8 s in: the send phase
# of 3 s of messages and the receive phase are over). docs/benchmarks.md, "Express latency at
# half the maximum". Usage: e2e_wakes.sh BIN_DIR RATE
BIN=$1; R=$2
perf record -D 4800 -e sched:sched_waking -g -o /tmp/wake.data $BIN/mqperf NOTX SENDANDRECEIVE '.\private$\perf' --payload string:1000 --formatter raw --count $((R*3)) --runs 1 --rate $R --json >/dev/null 2>/tmp/wake.err
perf script -i /tmp/wake.data -F comm,time,ip,sym 2>/dev/null | python3 -c "
import sys, collections
c = collections.Counter(); stack=[]; head=None; t0=None; t1=None
def flush():
    if head:
        fr=[s for s in stack if s and not s.startswith('[k]')]
        c[(head, ' < '.join(fr[:3]))]+=1
for line in sys.stdin:
    line=line.rstrip()
    if not line:
        flush(); head=None; stack=[]; continue
    if not line.startswith((' ','\t')):
        p=line.split(); head=p[0]; tt=float(p[-1].rstrip(':')); t0=t0 or tt; t1=tt; continue
    parts=line.strip().split(None,1)
    stack.append(parts[1][:80] if len(parts)==2 else '')
flush()
tot=sum(c.values()); dur=t1-t0
print(f'{tot} wakings in {dur:.2f} s = {tot/dur/$R:.2f} per message at $R/s')
for (h,k),n in c.most_common(12): print(f'{n/dur/$R:5.2f}/msg {h}: {k}')
"
