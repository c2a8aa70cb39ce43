"""A loop of one-message sends through the Python client (its Queue.send), after one warm-up
send; prints msgs/s. Usage: python py_send_rate.py URL QUEUE COUNT express|recoverable
(docs/benchmarks.md, "One message at a time"). Run it with the Python of a virtualenv that
holds the client to measure."""
import sys, time, mq_client
url, q, n, rec = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "recoverable"
c = mq_client.Client(url)
try:
    c.create_queue(q)
except mq_client.MqError:
    pass
qq = c.queue(q)
body = b"x" * 1000
qq.send(body, recoverable=rec)
t = time.perf_counter()
for _ in range(n):
    qq.send(body, recoverable=rec)
dt = time.perf_counter() - t
print(f"{n/dt:.0f}")
