#!/usr/bin/env python3
# CPU of the e2e phase of one embedded open-loop mqperf run (docs/benchmarks.md, "Express latency at
# half the maximum"): the process's cores, the machine's busy and steal share, and CPU µs per
# message, sampled every 100 ms inside the e2e phase (the last --count/rate seconds of the run).
# Usage: e2e_cpu.py MQPERF RATE [express|recoverable]; MQPERF_ARGS adds options (e.g.
# "--broker unix:/tmp/mqd.sock": then "process CPU" is mqperf's alone, the machine's share
# includes mqd).
import subprocess, time, os, sys, json
tck = os.sysconf('SC_CLK_TCK')
mq, rate = sys.argv[1], int(sys.argv[2]); d = sys.argv[3] if len(sys.argv) > 3 else "express"
secs = 4
cmd = [mq,"NOTX","SENDANDRECEIVE",r".\private$\perf","--payload","string:1000","--formatter","raw","--count",str(rate*secs),"--runs","1","--rate",str(rate),"--delivery",d,"--json"] + os.environ.get("MQPERF_ARGS", "").split()
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
def cpu():
    f = open(f"/proc/{p.pid}/stat").read().rsplit(')',1)[1].split()
    return (int(f[11]) + int(f[12])) / tck
def sysstat():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
    return f[3]+f[4], sum(f), f[7]
s=[]
while p.poll() is None:
    time.sleep(0.1)
    try: s.append((time.time(), cpu(), *sysstat()))
    except Exception: break
out = p.stdout.read()
end = s[-1][0]
w = [x for x in s if end - secs + 0.5 <= x[0] <= end - 0.3]
a, b = w[0], w[-1]
proc = (b[1]-a[1])/(b[0]-a[0]); tot=b[3]-a[3]
busy = 1-(b[2]-a[2])/tot; steal=(b[4]-a[4])/tot
for l in out.splitlines():
    if l.startswith('{'):
        r = json.loads(l)
        if r.get('op') == 'e2e':
            print(f"rate {rate} achieved {round(r['msgs_per_s'])} p50 {r['p50_us']:.0f} p99 {r['p99_us']:.0f} p999 {r['p999_us']:.0f} | e2e-phase proc cpu {proc:.2f} cores, machine busy {busy*100:.0f}% steal {steal*100:.1f}% | cpu-us/msg {proc*1e6/rate:.1f}")
