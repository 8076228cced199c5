"""The load generator against servers that write their streams differently from SGLang (real HTTP
servers on 127.0.0.1): any JSON whitespace is read, a format it cannot read is said, not waited on.
Also the prompts it sends (distinct, seeded, lazily built) and the memory budget of a load shape."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from typing import Any

import pytest
from aiohttp import web

from gpu_runbook.load import CONCURRENCY_MAX, PROMPT_TOKENS_IN_FLIGHT_MAX, TOKEN_ID_END, TOKEN_ID_START, LoadConfig, LoadGenerator, _number_after, prompt_ids
from gpu_runbook.target import Target
from sse_servers import completion_events, dump, generate_events, max_tokens, serve, streaming

STYLES = ["compact", "spaced", "pretty", "multiline", "crlf"]


@pytest.mark.parametrize(
    "text, value",
    [(b'"completion_tokens":12}', 12), (b'"completion_tokens": 12}', 12), (b'"completion_tokens" :\n    12\n}', 12),
     (b'"completion_tokens":\ndata:   12\ndata: }', 12), (b'"completion_tokens": null}', -1), (b'"completion_tokens"', -1),
     (b'"completion_tokens": "5"}', -1)],
)  # fmt: skip
def test_number_after_a_key_accepts_json_whitespace(text: bytes, value: int) -> None:
    assert _number_after(text, len(b'"completion_tokens"')) == value


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("endpoint", ["generate", "completions"])
async def test_every_token_is_counted_whatever_the_whitespace(endpoint: str, style: str) -> None:
    events = (lambda b: generate_events(max_tokens(b), style)) if endpoint == "generate" else (lambda b: completion_events(max_tokens(b), style))
    route = "/generate" if endpoint == "generate" else "/v1/completions"
    async with serve({route: streaming(events)}) as url:
        cfg = LoadConfig(endpoint=endpoint, concurrency=3, input_len=8, output_len=6, max_requests=6, model="m")
        rep = await LoadGenerator(Target(sglang_url=url), cfg).run()
    assert rep.failed == 0, rep.error_examples
    assert rep.completed == 6 and rep.output_tokens == rep.completed_output_tokens == 36
    assert rep.uncounted_requests == 0 and rep.stream_problem is None
    assert rep.ttft_ms.p50 is not None and rep.e2e_ms.p50 is not None


@pytest.mark.parametrize("style", ["spaced", "pretty"])
async def test_coalesced_events_and_a_last_event_without_a_blank_line(style: str) -> None:
    def events(body: dict[str, Any]) -> list[bytes]:
        evs = generate_events(max_tokens(body), style, per_event=4)
        return evs[:-1] + [b"data: [DONE]"]  # then the connection closes

    async with serve({"/generate": streaming(events)}) as url:
        rep = await LoadGenerator(Target(sglang_url=url), LoadConfig(concurrency=2, output_len=10, max_requests=2)).run()
    assert rep.failed == 0, rep.error_examples
    assert rep.completed == 2 and rep.output_tokens == 20


@pytest.mark.parametrize("style", ["compact", "pretty", "multiline"])
async def test_an_error_event_is_an_error_whatever_the_whitespace(style: str) -> None:
    def events(body: dict[str, Any]) -> list[bytes]:
        return generate_events(2, style)[:-1] + [dump({"error": {"message": "KV cache is full", "retryable": False}}, style), b"data: [DONE]\n\n"]

    async with serve({"/generate": streaming(events)}) as url:
        rep = await LoadGenerator(Target(sglang_url=url), LoadConfig(concurrency=1, output_len=5, max_requests=2)).run()
    assert rep.completed == 0 and rep.errors_by_kind == {"server_error": 2}
    assert "KV cache is full" in rep.error_examples["server_error"]


async def test_text_that_mentions_error_or_completion_tokens_is_not_mistaken_for_them() -> None:
    def events(body: dict[str, Any]) -> list[bytes]:
        out = []
        for k in range(1, 4):
            text = 'say "error": {"completion_tokens": 999}' * k
            out.append(dump({"text": text, "meta_info": {"id": "a", "completion_tokens": k}}, "spaced"))
        return out + [b"data: [DONE]\n\n"]

    async with serve({"/generate": streaming(events)}) as url:
        rep = await LoadGenerator(Target(sglang_url=url), LoadConfig(concurrency=1, output_len=3, max_requests=2)).run()
    assert rep.failed == 0 and rep.completed == 2 and rep.output_tokens == 6


async def test_a_stream_format_it_cannot_read_is_said_at_once() -> None:
    """Requests finish, no token is counted: until_streaming stops waiting and says why."""

    def events(body: dict[str, Any]) -> list[bytes]:  # no completion_tokens anywhere (not SGLang's /generate)
        return [dump({"token": {"text": "x"}, "generated_text": None}, "spaced") for _ in range(3)] + [b"data: [DONE]\n\n"]

    async with serve({"/generate": streaming(events)}) as url:
        gen = LoadGenerator(Target(sglang_url=url), LoadConfig(concurrency=4, output_len=3))
        await gen.start()
        try:
            # limit 120 s, deadline 30 s: only an early answer passes
            assert await asyncio.wait_for(gen.until_streaming(limit_s=120.0), 30.0) is False
            problem = gen.stream_problem()
        finally:
            rep = await gen.stop()
    assert problem is not None and "no tokens were counted: the stream format was not understood" in problem
    assert '"token"' in problem  # the first event, to see what the server sent
    assert rep.completed > 0 and rep.output_tokens == 0 and rep.uncounted_requests == rep.completed
    assert rep.stream_problem is not None and rep.stream_problem.startswith(f"{rep.completed} request")


async def test_one_readable_token_means_the_format_is_understood() -> None:
    async with serve({"/generate": streaming(lambda b: generate_events(max_tokens(b), "pretty"))}) as url:
        gen = LoadGenerator(Target(sglang_url=url), LoadConfig(concurrency=2, output_len=3, max_requests=4))
        await gen.run()
    assert gen.stream_problem() is None


# ---- the prompts ---------------------------------------------------------------------------------


def test_prompt_ids_are_seeded_distinct_and_in_range() -> None:
    a = [json.loads(b"[" + prompt_ids(7, n, 64) + b"]") for n in range(1, 50)]
    assert a == [json.loads(b"[" + prompt_ids(7, n, 64) + b"]") for n in range(1, 50)]  # reproducible
    assert all(len(p) == 64 and all(TOKEN_ID_START <= t < TOKEN_ID_END for t in p) for p in a)
    assert len({tuple(p[:4]) for p in a}) == len(a)  # no two requests share even a 4-token prefix
    assert len({t for p in a for t in p}) > 1000  # random ids, not a pattern over a few
    assert json.loads(b"[" + prompt_ids(8, 1, 64) + b"]") != a[0]  # another seed, other prompts


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
async def test_each_request_sends_its_own_prompt_and_the_temperature(endpoint: str) -> None:
    received: list[dict[str, Any]] = []
    route = "/generate" if endpoint == "generate" else "/v1/completions"
    events = (lambda b: generate_events(max_tokens(b), "compact")) if endpoint == "generate" else (lambda b: completion_events(max_tokens(b), "compact"))

    async def run(seed: int) -> list[tuple[int, ...]]:
        received.clear()
        async with serve({route: streaming(events, received)}) as url:
            cfg = LoadConfig(endpoint=endpoint, concurrency=4, input_len=40, output_len=2, max_requests=12, temperature=0.7, seed=seed, model="m")
            rep = await LoadGenerator(Target(sglang_url=url), cfg).run()
        assert rep.completed == 12 and rep.input_tokens == 12 * 40
        key = "input_ids" if endpoint == "generate" else "prompt"
        if endpoint == "generate":
            assert all(b["sampling_params"] == {"temperature": 0.7, "max_new_tokens": 2, "ignore_eos": True} for b in received)
        else:
            assert all(b["temperature"] == 0.7 and b["max_tokens"] == 2 and b["model"] == "m" for b in received)
        prompts = [tuple(b[key]) for b in received]
        assert all(len(p) == 40 and all(isinstance(t, int) for t in p) for p in prompts)
        return prompts

    first = await run(seed=3)
    assert len(set(first)) == 12  # every request its own prompt
    assert set(await run(seed=3)) == set(first)  # the same seed: the same prompts (arrival order may differ)
    assert not set(await run(seed=4)) & set(first)


def test_temperature_defaults_to_greedy_and_must_be_finite() -> None:
    assert LoadConfig().temperature == 0.0
    for bad in (-0.1, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            LoadConfig(temperature=bad)


# ---- the memory budget ---------------------------------------------------------------------------


def test_a_load_shape_over_the_budget_is_refused_with_the_numbers() -> None:
    with pytest.raises(ValueError) as exc:
        LoadConfig(concurrency=256, input_len=200000)
    msg = str(exc.value)
    assert "256 concurrent x 200000 prompt tokens = 51,200,000 prompt tokens in flight" in msg
    assert f"budget of {PROMPT_TOKENS_IN_FLIGHT_MAX:,}" in msg
    LoadConfig(concurrency=2048, input_len=4096)  # the largest shapes the runbooks suggest still fit
    LoadConfig(concurrency=1, input_len=PROMPT_TOKENS_IN_FLIGHT_MAX)
    LoadConfig(concurrency=CONCURRENCY_MAX, input_len=1)
    with pytest.raises(ValueError, match=f"{CONCURRENCY_MAX + 1} concurrent streams, over the load's budget of 16,384"):
        LoadConfig(concurrency=CONCURRENCY_MAX + 1, input_len=1)


def test_the_cli_refuses_it_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_runbook.cli import main

    rc = main(["run", "power-starvation", "--simulate", "seed-rtx-pro-6000-tp8", "--no-tui", "--set", "load_input_len=200000"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "load: input_len: 256 concurrent x 200000 prompt tokens" in err and "budget" in err and "Traceback" not in err
    assert "param 'load_input_len' = 200000" in err  # the --set name the user typed, not only the load's field


def test_a_load_field_out_of_range_names_the_param_that_feeds_it(capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_runbook.cli import main

    rc = main(["run", "power-starvation", "--simulate", "seed-rtx-pro-6000-tp8", "--no-tui", "--set", "load_output_range_ratio=2"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "param 'load_output_range_ratio' = 2.0: load: output_range_ratio:" in err and "Traceback" not in err


async def test_prompts_are_built_per_request_and_not_kept() -> None:
    """16 streams of 60,000-token prompts (~350 KB of JSON each) held open: the client keeps no
    prompt once sent, so what it holds is far below even one prompt per stream."""
    open_streams = asyncio.Event()
    started: list[int] = []
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        while await request.content.read(1 << 16):  # read and drop the prompt, as a server does once tokenized
            pass
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(dump({"text": "x", "meta_info": {"completion_tokens": 1}}, "compact"))
        started.append(1)
        if len(started) == 16:
            open_streams.set()
        await release.wait()
        await resp.write(dump({"text": "xx", "meta_info": {"completion_tokens": 2}}, "compact") + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    input_len = 60000
    async with serve({"/generate": handler}) as url:
        gen = LoadGenerator(Target(sglang_url=url), LoadConfig(concurrency=16, input_len=input_len, output_len=2, max_requests=16))
        prompt_bytes = len(prompt_ids(0, 1, input_len))
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            await gen.start()
            await asyncio.wait_for(open_streams.wait(), 60)
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            release.set()
            rep = await gen.stop()
    assert prompt_bytes > 250_000
    assert held < 4 * prompt_bytes, f"{held:,} bytes held with 16 streams open; one prompt is {prompt_bytes:,}"
    assert rep.failed == 0
