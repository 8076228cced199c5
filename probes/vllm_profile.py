"""`vllm.profile`: the decode profile's role on vLLM. vLLM registers `/start_profile` only when it was launched
with its profiler (profiling.md §7), and a tool cannot switch it on afterwards: so the probe first asks, without
side effects, whether the route exists (a GET answers 405 where the POST route is registered, 404 where it is not),
and says the exact launch setting the release reads when it does not. Reading vLLM's traces into the decode
breakdown (`ProfileValues`) is not built yet: a server with its profiler on is told so, and nothing is started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_runbook.evidence import Evidence
from gpu_runbook.fetch import FetchError, fetch
from gpu_runbook.probe import Probe

from . import vllm_facts as facts
from .profile import SglangProfile
from .profile_values import ProfileValues
from .sglang import ProbeError, _as_evidence, get_json

if TYPE_CHECKING:
    from gpu_runbook.probe import Context


class VllmProfile(Probe):
    name = "vllm.profile"
    server_kind, role = "vllm", "server.profile"
    description = "vLLM decode profile: whether the server was launched with its profiler, and the launch setting when not"
    Params = SglangProfile.Params  # the same params, so a runbook's `with:` holds for either server
    Values = ProfileValues
    default_timeout_s = 15.0
    needs = "profile"  # the profile's role: --depth quick leaves it out, as it does sglang.profile

    async def run(self, ctx: "Context", params: Any) -> Evidence:
        try:
            body = await get_json(ctx, "/version", 10)
        except ProbeError as e:
            return _as_evidence(e)
        version = body.get("version") if isinstance(body, dict) and isinstance(body.get("version"), str) else None
        url = ctx.target.sglang_url.rstrip("/") + "/start_profile"
        try:
            r = await fetch(ctx.http, url, headers=ctx.target.auth_headers(), timeout_s=10)
        except FetchError as e:  # the shared layer's limits (size, deadline, same-origin redirects) say what failed
            return Evidence.unavailable(f"/start_profile: {e.message}")
        setting = facts.profiler_launch_setting(version, params.output_dir or "/tmp/vllm-profile")
        if r.status_code == 404:
            return Evidence.unavailable(
                f"vLLM {version or '(version unknown)'} was not launched with its profiler (/start_profile is not "
                f"registered); relaunch with {setting} to profile decode steps")  # fmt: skip
        return Evidence.unavailable(
            f"vLLM {version or '(version unknown)'} has its profiler on (/start_profile answers HTTP {r.status_code} to GET), "
            "but reading vLLM traces into the decode breakdown is not built yet: nothing was started")  # fmt: skip
