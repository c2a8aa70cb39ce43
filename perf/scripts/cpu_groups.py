#!/usr/bin/env python3
# A perf.data profile grouped by crate (user space) or kernel area, as a share of samples and
# as CPU µs per message. docs/benchmarks.md, "Express latency at half the maximum".
# Usage: cpu_groups.py PERF_DATA CORES_BUSY MSGS_PER_S
import sys, re, collections, subprocess
data, cores, rate = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
out = subprocess.run(["perf","report","-i",data,"--no-children","--sort","sym","--stdio","-g","none"],capture_output=True,text=True).stdout
g = collections.Counter()
for line in out.splitlines():
    m = re.match(r'\s+([\d.]+)%\s+\[(.)\]\s+(.*)', line)
    if not m: continue
    pct, kind, sym = float(m.group(1)), m.group(2), m.group(3).strip()
    if kind == 'k':
        k = 'kernel'
        if re.search(r'tcp|ip_|skb|napi|netif|sock|copy_(from|to)_iter|dev_queue|loopback|net_rx|__inet', sym): k='kernel-net'
        elif re.search(r'sched|switch|futex|wake|idle|hrtimer|nanosleep|epoll|ep_', sym): k='kernel-sched'
    else:
        m2 = re.match(r'(?:<)?([a-z_][a-z0-9_]*)::', sym)
        if sym.startswith(('mi_','_mi_','mi ')): k='mimalloc'
        elif 'memmove' in sym or 'memcpy' in sym or 'memset' in sym: k='memcpy'
        elif m2: k=m2.group(1)
        else: k='other:'+sym[:30]
    g[k]+=pct
tot = sum(g.values())
for k,v in g.most_common(22): print(f"{k:28s} {v:5.1f}%  {v/100*cores*1e6/rate:5.2f} us/msg")
