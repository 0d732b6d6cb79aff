"""The host's own noise: a bare round trip between two processes over loopback TCP, no daemon, no Redis.

Every latency figure of the run is made of such hand-offs between processes (a client, the daemon, Redis),
so their tails are bounded below by this one's on the same host at the same time. On a shared VM with two
vCPUs its p99 moves from run to run with the host's steal; the figure is printed to read the others by.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import anyio

from bench.harness import Env, Figure, pct

MESSAGE = b"x" * 64
ECHO = """
import socket, sys
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
peer, _ = listener.accept()
peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while data := peer.recv(4096):
    peer.sendall(data)
"""


async def round_trip(env: Env) -> Figure:
    """p99 of a 64-byte message to a process that echoes it, sequential, each awaited in a blocking recv."""
    count = 1000 if env.quick else 5000
    samples = await anyio.to_thread.run_sync(ping_pong, count)
    return Figure("host: bare round trip between two processes (loopback TCP)", "ms p99", pct(samples, 0.99), None,
                  extra={"p50_us": pct(samples, 0.5) * 1000, "p999_ms": pct(samples, 0.999), "samples": count})


def ping_pong(count: int) -> list[float]:
    """Milliseconds of each of `count` round trips to an echoing child process."""
    echo = subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
    try:
        assert echo.stdout is not None
        port = int(echo.stdout.readline())
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            samples = []
            for _ in range(count):
                start = time.perf_counter()
                sock.sendall(MESSAGE)
                received = 0
                while received < len(MESSAGE):
                    received += len(sock.recv(4096))
                samples.append((time.perf_counter() - start) * 1000)
        return samples
    finally:
        echo.wait(timeout=10)
