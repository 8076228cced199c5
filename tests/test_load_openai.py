"""The load generator over the OpenAI API (`/v1/completions` streaming) agrees with a reference client that reads
the same streams (tests/stream_tee.py: the same bytes, where and when the load generator reads them, parsed as
`vllm bench serve` parses them) within 5 %, on the simulated vLLM server.

The simulated steps last 60 ms, so 5 % of an inter-token gap is 3 ms, far below a misread stream (a chunk counted
twice halves the gap; one token in 24 missed is 4 % of the count, which must match exactly anyway).
`benchmarks/load_openai_reference.py` prints the figures side by side, and the server's own TTFT beside them.
"""

from __future__ import annotations

import asyncio

from stream_tee import ReferenceReader

from gpu_runbook.load import LoadConfig, LoadGenerator
from gpu_runbook.sim.vllm_server import VllmSimConfig, VllmSimServer
from gpu_runbook.target import Target

TOLERANCE = 0.05


def close(ours: float, ref: float) -> bool:
    return abs(ours - ref) <= TOLERANCE * abs(ref)


def test_load_generator_matches_a_reference_reader_of_the_same_streams():
    cfg = VllmSimConfig(step_base_ms=60, step_per_req_ms=0.0, prefill_ms_per_1k_tokens=0.0, spec={"max_num_seqs": 64})
    load = LoadConfig(endpoint="generate", concurrency=16, input_len=32, output_len=24, max_requests=48)
    with VllmSimServer(cfg) as server, ReferenceReader() as reader:
        gen = LoadGenerator(Target(sglang_url=server.url, server_kind="vllm"), load)
        report = asyncio.run(gen.run())
    ref = reader.figures()
    assert gen.config.endpoint == "completions"  # vLLM has no /generate
    assert report.completed == ref.requests == 48 and report.failed == 0
    assert report.completed_output_tokens == ref.output_tokens == 48 * 24  # the same count, exactly
    pairs = {
        "output tokens/s": (report.output_tokens_per_s, ref.output_tokens_per_s),
        "requests/s": (report.request_throughput, ref.request_throughput),
        "TTFT mean ms": (report.ttft_ms.mean, ref.ttft_ms_mean),
        "ITL mean ms": (report.itl_ms.mean, ref.itl_ms_mean),
        "ITL p50 ms": (report.itl_ms.p50, ref.itl_ms_p50),
    }
    off = {k: v for k, v in pairs.items() if v[0] is None or not close(v[0], v[1])}
    assert not off, f"beyond {TOLERANCE:.0%} of the reference: {off}"
