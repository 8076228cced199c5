"""Which server answers at the target's URL: SGLang, vLLM, or neither, from what it answers.

Asked once per run, before the walk, so a runbook's server probes resolve to the family that speaks this
server's API (Registry.for_target). Each signal is one the server kind sends of itself
(shared/reference/vllm-and-fleet.md §2-§3): `/v1/models` names its owner (`owned_by: vllm | sglang`),
SGLang's `/server_info` (`/get_server_info` before 0.5.6) is a flat object with `model_path` and `tp_size`,
vLLM's `/version` answers `{"version": ...}` and every vLLM `/metrics` carries `vllm:` series. `--server-kind`
skips the questions. What was found is kept in words (`Target.server_found`) for the results and the report.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import httpx

from . import json_bounded

ASK_TIMEOUT_S = 5.0  # per read, and for one whole answer (a slowloris server trickling bytes is cut off here)
MAX_READ = 1 << 20  # a probe of identity reads at most this much of one answer


@dataclass(frozen=True)
class Detection:
    kind: str  # "sglang" | "vllm" | "unknown"
    found: str  # what it answered, in words


def _get(client: httpx.Client, url: str, headers: dict[str, str]) -> tuple[int | None, str]:
    """(status, body text up to MAX_READ), or (None, why) when nothing answered."""
    deadline = time.monotonic() + ASK_TIMEOUT_S
    try:
        with client.stream("GET", url, headers=headers, timeout=ASK_TIMEOUT_S, follow_redirects=False) as r:
            body = b""
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > MAX_READ:
                    break
                if time.monotonic() > deadline:
                    return None, f"no complete answer within {ASK_TIMEOUT_S:g} s"
            return r.status_code, body[:MAX_READ].decode("utf-8", "replace")
    except httpx.TimeoutException:
        return None, f"no answer within {ASK_TIMEOUT_S:g} s"
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc or 'connection refused'}"


def _clean(text: object) -> str:
    """A server's string as plain data: letters, digits and version punctuation only, at most 40 characters."""
    return re.sub(r"[^A-Za-z0-9._+-]", "?", str(text))[:40]


def _json(text: str, path: str, seen: list[str]) -> object:
    """The answer's JSON, or None; a too-deep answer is said in what detection saw (a hostile server's, not a crash)."""
    try:
        return json_bounded.loads(text)
    except json_bounded.TooDeep as exc:
        seen.append(f"{path}: {exc}")
        return None
    except ValueError:
        return None


def detect(base_url: str, headers: dict[str, str] | None = None, client: httpx.Client | None = None) -> Detection:
    """Ask the server who it is; never raises (an unreachable URL is `unknown`, saying so)."""
    base = base_url.rstrip("/")
    headers = headers or {}
    own = client is None
    client = client or httpx.Client(trust_env=False)
    seen: list[str] = []
    try:
        status, text = _get(client, base + "/v1/models", headers)
        if status is None:
            return Detection("unknown", f"nothing answered at {base} ({text})")
        body = _json(text, "/v1/models", seen) if status == 200 else None
        data = body.get("data") if isinstance(body, dict) else None
        owners = {m.get("owned_by") for m in data if isinstance(m, dict)} if isinstance(data, list) else set()
        if "vllm" in owners:
            return Detection("vllm", "vLLM: /v1/models is owned_by vllm")
        if "sglang" in owners:
            return Detection("sglang", "SGLang: /v1/models is owned_by sglang")
        seen.append(f"/v1/models HTTP {status}" + (f" (owned_by {', '.join(sorted(_clean(o) for o in owners))})" if owners else ""))
        for path in ("/server_info", "/get_server_info"):
            status, text = _get(client, base + path, headers)
            body = _json(text, path, seen) if status == 200 else None
            if isinstance(body, dict) and ("model_path" in body or "tp_size" in body):
                return Detection("sglang", f"SGLang: {path} reports model_path/tp_size")
            if isinstance(body, dict) and "vllm_config" in body:
                return Detection("vllm", f"vLLM: {path} reports vllm_config (dev mode)")
            seen.append(f"{path} HTTP {status}" if status is not None else f"{path}: {text}")
        status, text = _get(client, base + "/version", headers)
        body = _json(text, "/version", seen) if status == 200 else None
        if isinstance(body, dict) and isinstance(body.get("version"), str) and len(body) == 1:
            return Detection("vllm", f"vLLM {_clean(body['version'])}: /version answers with a version alone")
        seen.append(f"/version HTTP {status}" if status is not None else f"/version: {text}")
        status, text = _get(client, base + "/metrics", headers)
        if status == 200 and "\nvllm:" in "\n" + text:
            return Detection("vllm", "vLLM: /metrics carries vllm: series")
        if status == 200 and "\nsglang:" in "\n" + text:
            return Detection("sglang", "SGLang: /metrics carries sglang: series")
        seen.append(f"/metrics HTTP {status}" + (" without vllm: or sglang: series" if status == 200 else "") if status is not None else f"/metrics: {text}")
        locked = any(" HTTP 401" in x or " HTTP 403" in x for x in seen)
        hint = "; it wants an API key, or refused the one given (--api-key or RUNBOOK_API_KEY)" if locked else ""
        return Detection("unknown", f"an HTTP server at {base} that answers neither as SGLang nor as vLLM ({'; '.join(seen)}){hint}")
    finally:
        if own:
            client.close()
