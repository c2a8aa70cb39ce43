#!/usr/bin/env python3
"""Bins the fdatasyncs of an `strace -f -tt -T` log by 250 ms: count, largest, how many over 2 ms,
and the ftruncate/rename/unlink/fallocate/fsync calls in each bin (docs/benchmarks.md, "Reusing
dropped segments"). Usage: fdatasync_bins.py STRACE_LOG..."""
import sys,re
from datetime import datetime
for f in sys.argv[1:]:
    ev=[]
    for l in open(f):
        m=re.match(r'(\d+)\s+(\d+):(\d+):(\d+\.\d+)\s+(\w+)\((.*?)<(\d+\.\d+)>$', l.strip())
        if not m:
            continue
        pid,h,mi,s,name,args,dur=m.groups()
        t=int(h)*3600+int(mi)*60+float(s)
        ev.append((t,int(pid),name,float(dur),args[:60]))
    t0=ev[0][0]
    print("==",f)
    # timeline of special calls
    for t,pid,name,dur,args in ev:
        if name in ('renameat2','ftruncate','unlink','fallocate','fsync') and (name!='ftruncate' or dur>0.002):
            pass
    fd=[e for e in ev if e[2]=='fdatasync']
    # per 250 ms bins: count of fdatasync, max, >2ms, and other events
    import collections
    bins=collections.defaultdict(lambda:[0,0.0,0,[]])
    for t,pid,name,dur,args in ev:
        b=int((t-t0)/0.25)
        if name=='fdatasync':
            bins[b][0]+=1; bins[b][1]=max(bins[b][1],dur); bins[b][2]+= dur>0.002
        elif name in ('renameat2','unlink','fallocate','fsync'):
            bins[b][3].append(f"{name}{dur*1e3:.1f}")
        elif name=='ftruncate':
            bins[b][3].append('T')
    for b in sorted(bins):
        n,mx,over,o=bins[b]
        tt=''.join(x for x in o if x=='T')
        oth=[x for x in o if x!='T']
        print(f"{b*0.25:6.2f}s fdatasync {n:4} max {mx*1e3:6.2f} ms >2ms {over:3}  trunc {len(tt):3} {' '.join(oth)}")
