"""The load generator's figures over `/v1/completions` beside a reference reader of the same streams
(tests/stream_tee.py: `vllm bench serve`'s way of reading, json per event) and the simulated vLLM server's own
TTFT histogram, at a few concurrencies. The test (tests/test_load_openai.py) asserts 5 %; this prints the numbers.

    python benchmarks/load_openai_reference.py [--concurrency 16 64] [--requests 4]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from stream_tee import ReferenceReader  # noqa: E402

from gpu_runbook.load import LoadConfig, LoadGenerator  # noqa: E402
from gpu_runbook.sim.vllm_server import VllmSimConfig, VllmSimServer  # noqa: E402
from gpu_runbook.target import Target  # noqa: E402


def server_ttft_ms(url: str) -> float:
    text = httpx.get(url + "/metrics", trust_env=False).text
    total = float(re.search(r"vllm:time_to_first_token_seconds_sum\{[^}]*\} (\S+)", text).group(1))
    count = float(re.search(r"vllm:time_to_first_token_seconds_count\{[^}]*\} (\S+)", text).group(1))
    return total / count * 1000 if count else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--requests", type=int, default=4, help="requests per stream slot")
    ap.add_argument("--output-len", type=int, default=24)
    args = ap.parse_args()
    print(f"{'conc':>5} {'figure':<16} {'load gen':>10} {'reference':>10} {'diff':>7}")
    for c in args.concurrency:
        cfg = VllmSimConfig(step_base_ms=60, step_per_req_ms=0.0, prefill_ms_per_1k_tokens=0.0, spec={"max_num_seqs": max(64, c)})
        load = LoadConfig(concurrency=c, input_len=32, output_len=args.output_len, max_requests=c * args.requests)
        with VllmSimServer(cfg) as server, ReferenceReader() as reader:
            report = asyncio.run(LoadGenerator(Target(sglang_url=server.url, server_kind="vllm"), load).run())
            own = server_ttft_ms(server.url)
        ref = reader.figures()
        rows = [("output tok/s", report.output_tokens_per_s, ref.output_tokens_per_s),
                ("requests/s", report.request_throughput, ref.request_throughput),
                ("TTFT mean ms", report.ttft_ms.mean, ref.ttft_ms_mean), ("TTFT p50 ms", report.ttft_ms.p50, ref.ttft_ms_p50),
                ("ITL mean ms", report.itl_ms.mean, ref.itl_ms_mean), ("ITL p50 ms", report.itl_ms.p50, ref.itl_ms_p50),
                ("output tokens", report.completed_output_tokens, ref.output_tokens)]  # fmt: skip
        for name, ours, theirs in rows:
            print(f"{c:>5} {name:<16} {ours:>10.2f} {theirs:>10.2f} {(ours - theirs) / theirs:>+7.1%}")
        print(f"{c:>5} {'server TTFT ms':<16} {own:>10.2f}  (the server's histogram: from its arrival, without the client's send)")


if __name__ == "__main__":
    main()
