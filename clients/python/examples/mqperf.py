#!/usr/bin/env python3
"""Throughput of the Python client, mqperf-style: N messages of B bytes sent with a pipelined
sender (send rate, until every acknowledgement is in), then received with a streaming receiver
and acknowledged (receive rate). Prints a banner, a table per run and one JSON line per run.

    python clients/python/examples/mqperf.py --mqd target/release/mqd --count 100000
    python clients/python/examples/mqperf.py --url http://127.0.0.1:1801 --recoverable

With ``--mqd`` it starts that broker on a free loopback port with a temporary data directory
and stops it (by PID) at the end; with ``--url`` it uses a running broker.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from mq_client import Client


def start_mqd(path: str) -> "tuple[subprocess.Popen[bytes], str, str]":
    data = tempfile.mkdtemp(prefix="mq-pyperf-")
    proc = subprocess.Popen(
        [path, "--listen", "127.0.0.1:0", "--data-dir", data],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("listening on "):
        proc.kill()
        sys.exit(f"mqd did not start: {line!r}")
    return proc, "http://" + line.split()[-1], data


def one_run(client: Client, count: int, size: int, recoverable: bool, prefetch: int) -> dict:
    name = ".\\private$\\pyperf-" + uuid.uuid4().hex[:8]
    client.create_queue(name)
    q = client.queue(name)
    body = os.urandom(size)
    try:
        t0 = time.perf_counter()
        with q.sender() as s:
            for _ in range(count):
                s.send(body, recoverable=recoverable)
            ids = s.flush()
        send_s = time.perf_counter() - t0
        assert len(ids) == count
        t1 = time.perf_counter()
        got = 0
        with q.receive(timeout=5.0, prefetch=prefetch, max_messages=count) as r:
            for msg in r:
                msg.ack()
                got += 1
        recv_s = time.perf_counter() - t1
        assert got == count, f"received {got} of {count}"
    finally:
        client.delete_queue(name)
    return {
        "count": count,
        "size": size,
        "recoverable": recoverable,
        "send_msgs_per_s": round(count / send_s),
        "send_mb_per_s": round(count * size / send_s / 1e6, 1),
        "receive_msgs_per_s": round(count / recv_s),
        "receive_mb_per_s": round(count * size / recv_s / 1e6, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--mqd", help="start this mqd binary (port 0, temporary data dir)")
    where.add_argument("--url", help="use the broker at this URL")
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prefetch", type=int, default=1024)
    ap.add_argument("--recoverable", action="store_true", help="recoverable (on disk), not express")
    args = ap.parse_args()

    proc = None
    data = None
    url = args.url
    if args.mqd:
        proc, url, data = start_mqd(args.mqd)
    try:
        import grpc

        print(
            f"# mq-client throughput: {args.count} x {args.size} B, "
            f"{'recoverable' if args.recoverable else 'express'}, {args.runs} runs, "
            f"prefetch {args.prefetch}; broker {url}; Python {platform.python_version()}, "
            f"grpcio {grpc.__version__}, {os.cpu_count()} CPUs"
        )
        print(
            f"{'run':>3} {'send msg/s':>11} {'send MB/s':>10} {'recv msg/s':>11} {'recv MB/s':>10}"
        )
        results = []
        with Client(url) as client:
            for i in range(args.runs):
                r = one_run(client, args.count, args.size, args.recoverable, args.prefetch)
                results.append(r)
                print(
                    f"{i + 1:>3} {r['send_msgs_per_s']:>11,} {r['send_mb_per_s']:>10} "
                    f"{r['receive_msgs_per_s']:>11,} {r['receive_mb_per_s']:>10}"
                )
        for r in results:
            print(json.dumps(r))
        print(
            "median: send {:,} msg/s, receive {:,} msg/s".format(
                round(statistics.median(r["send_msgs_per_s"] for r in results)),
                round(statistics.median(r["receive_msgs_per_s"] for r in results)),
            )
        )
    finally:
        if proc is not None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        if data is not None:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
