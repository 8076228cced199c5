"""HTTP to a server, for every server family: one place where a request going wrong becomes a `ProbeError`
whose `status` says whether the thing to measure is not there (`unavailable`: refused, 401, 404, timeout) or the
data is broken (`failed`: malformed JSON or metrics text), so each probe turns it into evidence with a clear reason.
"""

from __future__ import annotations

from typing import Any

import httpx
from gpu_runbook import fetch as fetch_limits
from gpu_runbook import json_bounded
from gpu_runbook.fetch import FetchError, fetch
from gpu_runbook.plugin import Context, Evidence


class ProbeError(Exception):
    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status  # "unavailable" | "failed"
        self.reason = reason


class NotFound(ProbeError):
    def __init__(self, reason: str) -> None:
        super().__init__("unavailable", reason)


MAX_BODY_BYTES = fetch_limits.MAX_BODY_BYTES  # the most read from one answer (decompressed): gpu_runbook.fetch


async def get(ctx: Context, path: str, timeout_s: float) -> httpx.Response:
    """GET `path` on the target's server; 200 or a ProbeError (NotFound for 404). Through gpu_runbook.fetch:
    the body is capped after decompression, the whole exchange has `timeout_s`, redirects stay on the target."""
    base = ctx.target.server_url.rstrip("/")
    try:
        r = await fetch(ctx.http, base + path, headers=ctx.target.auth_headers(), timeout_s=timeout_s)
    except FetchError as e:
        raise fetch_error(e, base, path, timeout_s) from e
    if r.status_code == 401:
        hint = "the API key was refused" if ctx.target.auth_headers() else "the server needs an API key (set the target's api_key)"
        raise ProbeError("unavailable", f"401 Unauthorized from {path}: {hint}")
    if r.status_code == 404:
        raise NotFound(f"{path} not found (404)")
    if r.status_code != 200:
        raise ProbeError("unavailable", f"{path} answered HTTP {r.status_code}: {r.text[:200]}")
    return r


def fetch_error(e: FetchError, base: str, path: str, timeout_s: float) -> ProbeError:
    if e.kind == "connect":
        return ProbeError("unavailable", f"cannot connect to the server at {base}: {e.message.split(': ', 1)[-1]}")
    if e.kind == "timeout":
        return ProbeError("unavailable", f"the server at {base} did not answer {path} within {timeout_s:g} s")
    if e.kind == "http":
        return ProbeError("unavailable", f"{path} on {base}: {e.message.split(': ', 1)[-1]}")
    return ProbeError("failed", e.message)  # too large, a bad encoding, a redirect off the target


async def get_json(ctx: Context, path: str, timeout_s: float) -> Any:
    r = await get(ctx, path, timeout_s)
    try:
        return json_bounded.loads(r.content)
    except ValueError as e:
        raise ProbeError("failed", f"malformed JSON from {path}: {e}") from e


async def get_json_fallback(ctx: Context, paths: tuple[str, ...], timeout_s: float) -> tuple[Any, str]:
    """First of `paths` that exists (newer name first), with the path that answered."""
    last: NotFound | None = None
    for p in paths:
        try:
            return await get_json(ctx, p, timeout_s), p
        except NotFound as e:
            last = e
    raise NotFound(f"none of {', '.join(paths)} exists ({last})")


def as_evidence(e: ProbeError, **kw: Any) -> Evidence:
    return Evidence.unavailable(e.reason, **kw) if e.status == "unavailable" else Evidence.failed(e.reason, **kw)


async def served_model_path(ctx: Context, timeout_s: float = 10.0) -> str:
    """Where the served model's weights lie: `/server_info`'s model_path where the server has it, else the OpenAI
    API's `/v1/models` (its first model's `root`, else its id), which every OpenAI-compatible server serves."""
    first_error: ProbeError | None = None
    try:
        body, _ = await get_json_fallback(ctx, ("/server_info", "/get_server_info"), timeout_s)
        if isinstance(body, dict) and isinstance(body.get("model_path"), str) and body["model_path"]:
            return body["model_path"]
    except ProbeError as e:
        first_error = e
    try:
        models = await get_json(ctx, "/v1/models", timeout_s)
    except ProbeError as e:
        raise ProbeError(e.status, (first_error or e).reason) from e
    data = models.get("data") if isinstance(models, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    path = first.get("root") or first.get("id")
    if not isinstance(path, str) or not path:
        raise ProbeError("unavailable", "the server reports no model path")
    return path
