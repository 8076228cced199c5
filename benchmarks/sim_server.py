"""Is the simulated server cheap enough not to be what a simulated run measures? (issue 5, acceptance 4)

Runs 1024 concurrent `/generate` streams against the simulated SGLang server (in its own thread, its
CPU read from the thread's clock) and prints its CPU-seconds per 1000 streamed tokens. The baseline,
measured in the same run with the same client and the same number of streams, chunks and bytes, is
a bare aiohttp handler that only writes pre-built chunks on a timer: the least any Python HTTP
streaming server can cost. The ratio is what the simulation (scheduler, batch model, metrics,
per-token JSON) adds on top.

    python benchmarks/sim_server.py [--streams 1024] [--seconds 6] [--step-ms 50]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_runbook.sim.host import raise_nofile_limit  # noqa: E402
from gpu_runbook.sim.sglang_server import SimServer, SimServerConfig  # noqa: E402


async def drive(url: str, streams: int, seconds: float, output_len: int) -> tuple[int, int]:
    """`streams` clients, each streaming /generate again and again; (SSE events, bytes) read."""
    events = nbytes = 0
    stop = time.monotonic() + seconds
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:

        async def one() -> None:
            nonlocal events, nbytes
            body = {"text": "hello " * 128, "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True}, "stream": True}
            while time.monotonic() < stop:
                async with session.post(url + "/generate", json=body) as resp:
                    async for line in resp.content:
                        if line.startswith(b"data: {"):
                            events += 1
                            nbytes += len(line)
                        if time.monotonic() >= stop:
                            return

        await asyncio.gather(*(one() for _ in range(streams)))
    return events, nbytes


class Baseline:
    """A bare aiohttp streaming handler in its own thread: `chunks` writes of `size` bytes, `step_s` apart."""

    def __init__(self, size: int, step_s: float, chunks: int) -> None:
        self.size, self.step_s, self.chunks = size, step_s, chunks
        self.url = ""
        self.cpu = 0.0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def handler(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = b"data: {" + b"x" * max(0, self.size - 9) + b"}\n\n"
        try:
            for _ in range(self.chunks):
                await asyncio.sleep(self.step_s)
                await resp.write(chunk)
            await resp.write_eof()
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            pass  # the client left at the end of the window
        return resp

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_post("/generate", self.handler)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        host, port = site._server.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
        self.url = f"http://{host}:{port}"
        self._ready.set()
        await self._stop.wait()
        self.cpu = time.thread_time()
        await runner.cleanup()

    def cpu_seconds(self) -> float:
        assert self._thread.ident is not None
        return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))

    def __enter__(self) -> "Baseline":
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--step-ms", type=float, default=50.0, help="decode step (both servers' write cadence)")
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()
    raise_nofile_limit()

    cfg = SimServerConfig(step_base_ms=args.step_ms, step_per_req_ms=0.0, prefill_ms_per_1k_tokens=0.0,
                          max_running_requests=4096, max_total_num_tokens=10**8)  # fmt: skip
    with SimServer(cfg) as srv:
        c0 = srv.cpu_seconds()
        events, nbytes = asyncio.run(drive(srv.url, args.streams, args.seconds, args.output_len))
        sim_cpu = srv.cpu_seconds() - c0
        tokens = srv.state.generation_tokens_total
    size = max(16, nbytes // max(1, events))
    with Baseline(size, args.step_ms / 1000, args.output_len) as base:
        c0 = base.cpu_seconds()
        b_events, b_bytes = asyncio.run(drive(base.url, args.streams, args.seconds, args.output_len))
        base_cpu = base.cpu_seconds() - c0

    sim_per_k = sim_cpu / max(1, tokens) * 1000
    base_per_k = base_cpu / max(1, b_events) * 1000
    print(f"streams: {args.streams}, window {args.seconds:.1f} s, step {args.step_ms:.0f} ms, {size} B per event")
    print(f"simulated server : {tokens:>8} tokens ({events} events read, {nbytes / 1e6:.1f} MB), {sim_cpu:6.2f} CPU-s, {sim_per_k:.4f} CPU-s / 1000 tokens")
    print(f"bare aiohttp     : {b_events:>8} chunks ({b_bytes / 1e6:.1f} MB), {base_cpu:6.2f} CPU-s, {base_per_k:.4f} CPU-s / 1000 chunks")
    print(f"ratio (simulated / bare): {sim_per_k / base_per_k if base_per_k else float('nan'):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
