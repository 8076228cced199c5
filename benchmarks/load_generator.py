"""How cheaply the load generator parses streams: output tokens per client CPU-second at 1024 streams.

The simulated SGLang server runs in a child process (so its CPU and the GIL are not the client's);
this process runs, in turn, `gpu_runbook.load.LoadGenerator` and a plain baseline client (asyncio
streams, one `json.loads` per SSE event, the way a straightforward client reads `/generate`) against
it with the same load, and prints each one's tokens per CPU-second and the ratio.
The load generator builds every request's own random prompt, as in a real run; the baseline sends
one fixed body, so the ratio includes that cost (about 20 us a request at 256 prompt tokens,
against ~5 ms of client CPU streaming its 256 output tokens).

    python benchmarks/load_generator.py [--concurrency 1024] [--seconds 8] [--output-len 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_runbook.load import LoadConfig, LoadGenerator  # noqa: E402
from gpu_runbook.probe import Target  # noqa: E402


def _serve(conn, step_base_ms: float) -> None:  # child process
    from gpu_runbook.sim.sglang_server import SimServer, SimServerConfig

    cfg = SimServerConfig(step_base_ms=step_base_ms, step_per_req_ms=0.0, prefill_ms_per_1k_tokens=0.0,
                          max_running_requests=4096, max_total_num_tokens=10**8)  # fmt: skip
    srv = SimServer(cfg)
    conn.send(srv.start())
    conn.recv()  # until told to stop
    conn.send(srv.cpu_seconds())
    srv.stop()


async def baseline(host: str, port: int, concurrency: int, input_len: int, output_len: int, seconds: float) -> int:
    """A plain client: raw HTTP/1.1 keep-alive connections, readline, json.loads per event."""
    body = json.dumps({"input_ids": [1000 + i for i in range(input_len)],
                       "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True},
                       "stream": True}).encode()  # fmt: skip
    head = (f"POST /generate HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    deadline = time.perf_counter() + seconds
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        try:
            while time.perf_counter() < deadline:
                writer.write(head + body)
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass  # status line and headers
                got = 0
                while True:
                    line = await reader.readline()
                    if not line:
                        return
                    if line.startswith(b"data: {"):
                        got_now = json.loads(line[6:])["meta_info"]["completion_tokens"]
                        tokens += got_now - got
                        got = got_now
                    elif line == b"0\r\n":
                        await reader.readline()
                        break
        finally:
            writer.close()

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.sleep(seconds)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return tokens


async def measure_loadgen(url: str, concurrency: int, input_len: int, output_len: int, seconds: float) -> tuple[int, float, float, float]:
    c0 = time.process_time()
    gen = LoadGenerator(Target(sglang_url=url), LoadConfig(concurrency=concurrency, input_len=input_len, output_len=output_len, duration_s=seconds))
    rep = await gen.run()
    return rep.output_tokens, time.process_time() - c0, rep.output_tokens_per_s, rep.client_cpu_share


async def measure_baseline(url: str, concurrency: int, input_len: int, output_len: int, seconds: float) -> tuple[int, float]:
    host, port = url.removeprefix("http://").split(":")
    c0 = time.process_time()
    n = await baseline(host, int(port), concurrency, input_len, output_len, seconds)
    return n, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--step-ms", type=float, default=60.0, help="simulated decode step (sets the offered token rate)")
    a = ap.parse_args()
    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=_serve, args=(child, a.step_ms), daemon=True)
    proc.start()
    url = parent.recv()
    print(f"simulated server {url} (child process), {a.concurrency} streams, {a.input_len}/{a.output_len} tokens, {a.seconds:g} s each")
    n_lg, cpu_lg, rate_lg, share_lg = asyncio.run(measure_loadgen(url, a.concurrency, a.input_len, a.output_len, a.seconds))
    n_bl, cpu_bl = asyncio.run(measure_baseline(url, a.concurrency, a.input_len, a.output_len, a.seconds))
    parent.send("stop")
    server_cpu = parent.recv()
    proc.join(10)
    lg = n_lg / cpu_lg if cpu_lg else 0.0
    bl = n_bl / cpu_bl if cpu_bl else 0.0
    print(f"load generator : {n_lg:>9} tokens  {cpu_lg:6.2f} CPU-s  {lg:>10.0f} tokens/CPU-s  ({rate_lg:.0f} tok/s, client_cpu_share {share_lg:.2f})")
    print(f"plain baseline : {n_bl:>9} tokens  {cpu_bl:6.2f} CPU-s  {bl:>10.0f} tokens/CPU-s")
    print(f"server (child) : {server_cpu:6.2f} CPU-s over both runs")
    print(f"ratio load generator / baseline (tokens per CPU-second): {lg / bl if bl else float('nan'):.2f}")


if __name__ == "__main__":
    main()
