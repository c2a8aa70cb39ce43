#!/usr/bin/env python3
# CPU of one embedded mqperf run (the recoverable 50% cell) and of the whole machine, every 100 ms
# (docs/benchmarks.md, "The commit tail when both cores are busy"). Usage: cpu_timeline.py
# (the mqperf binary: $MQPERF, default target/release/mqperf).
import subprocess, time, os, sys
tck = os.sysconf('SC_CLK_TCK')
cmd = [os.environ.get("MQPERF", "target/release/mqperf"),"NOTX","SENDANDRECEIVE",r".\private$\perf","--payload","string:1000","--formatter","raw","--count","180000","--runs","1","--rate","90000","--delivery","recoverable","--json"]
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
samples = []
def cpu():
    f = open(f"/proc/{p.pid}/stat").read().rsplit(')',1)[1].split()
    return (int(f[11]) + int(f[12])) / tck
def sysidle():
    f = open("/proc/stat").readline().split()
    return int(f[4]) + int(f[5]), sum(int(x) for x in f[1:8])
t0 = time.time(); last = (t0, cpu(), *sysidle())
while p.poll() is None:
    time.sleep(0.1)
    try:
        now = (time.time(), cpu(), *sysidle())
    except Exception:
        break
    dt = now[0] - last[0]
    idle = (now[2]-last[2]) / max(1, now[3]-last[3])
    samples.append((now[0]-t0, (now[1]-last[1])/dt, 1-idle))
    last = now
out = p.stdout.read()
for l in out.splitlines():
    if l.startswith('{'):
        import json; d = json.loads(l); print(d['op'], int(d['msgs_per_s']), 'p50', d.get('p50_us'), 'p99', d.get('p99_us'))
for t, c, busy in samples:
    print(f"{t:5.1f}s proc {c:4.2f} cores  machine busy {busy*100:3.0f}%")
