"""/flush_cache as released servers answer it (bench_serving --flush-cache needs it)."""

from __future__ import annotations

import asyncio

import httpx

from gpu_runbook.sim.sglang_server import SimServer, SimServerConfig

FLUSHED = "Cache flushed.\nPlease check backend logs for more details."


async def test_flush_cache_when_idle_and_refused_when_busy() -> None:
    async with SimServer(SimServerConfig(version="0.5.10", step_base_ms=5.0)) as srv, httpx.AsyncClient(base_url=srv.url, trust_env=False) as c:
        for method in ("GET", "POST"):
            r = await c.request(method, "/flush_cache")
            assert r.status_code == 200 and r.text.startswith(FLUSHED)

        async def stream() -> None:
            body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 100000, "ignore_eos": True}, "stream": True}
            async with c.stream("POST", "/generate", json=body) as resp:
                async for _ in resp.aiter_lines():
                    pass

        task = asyncio.create_task(stream())
        for _ in range(200):
            if srv.state.running:
                break
            await asyncio.sleep(0.02)
        r = await c.post("/flush_cache")
        assert r.status_code == 400 and r.text == "Flush cache failed.\n"
        r = await c.post("/flush_cache", params={"timeout": 0.2})
        assert r.status_code == 400 and r.text == "Timed out waiting for idle state."
        waiting = asyncio.create_task(c.post("/flush_cache", params={"timeout": 30}))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # 0.5.10+: waits for idle
        task.cancel()
        r = await waiting
        assert r.status_code == 200 and r.text.startswith(FLUSHED)
