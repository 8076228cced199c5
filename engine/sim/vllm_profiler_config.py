"""What a vLLM release's profiler is, from its launch settings: the environment variable through 0.12,
`--profiler-config` from 0.13 (the variable still read, deprecated, to 0.15), each read in the release's wheel.

Its own module so that a scenario can refuse settings its release would refuse (scenario.py) and the
simulated server can serve the profiler they give (profiler.py), neither importing the other.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

VLLM_NEW_CACHED_SINCE = (0, 11, 1)
VLLM_CONTEXT_SINCE = (0, 14, 0)
VLLM_DETAILED_SINCE = (0, 26, 0)  # vllm==0.26.0:vllm/config/profiler.py detailed_trace_annotation
VLLM_INSTANCE_NAME_SINCE = (0, 11, 1)
VLLM_RANK_SUFFIX_SINCE = (0, 17, 0)
VLLM_WRAPPER_SINCE = (0, 12, 0)  # start/stop ignored when (not) active, max iterations (gpu_profiler.py:69-129)
VLLM_PROFILER_CONFIG_SINCE = (0, 13, 0)
VLLM_ENV_IN_CONFIG_UNTIL = (0, 15, 999)
VLLM_START_BODY_SINCE = (0, 32, 0)
VLLM_VERSION_METADATA_SINCE = (0, 28, 0)
VLLM_SESSION_CONFLICT_SINCE = (0, 34, 0)  # the first release read with ProfilerAlreadyActiveError


def vllm_release(version: str | None) -> tuple[int, ...]:
    """A vLLM release as a tuple; a dev build (or no version) behaves as the newest release read."""
    from gpu_runbook.probes.vllm.facts import release  # noqa: PLC0415 - the one parser of vLLM versions

    return release(version) or (999, 0, 0)


@dataclass
class VllmProfilerSetting:
    """What the simulated vLLM server's profiler is, as its release resolves the launch settings."""

    kind: str  # torch | cuda | proton: only torch writes Kineto traces
    directory: str | None  # where the torch traces go (absolute, as vLLM makes it)
    how: str  # the launch setting that enabled it, in words
    max_iterations: int = 0
    use_gzip: bool = True
    frontend: bool = True  # the AsyncLLM CPU trace
    detailed: bool = False


def vllm_profiler_setting(version: str | None, spec: Any, cwd: str | None = None) -> VllmProfilerSetting | None:
    """The profiler a vLLM server launched with `spec` (a VllmSpec) runs on `version`, or None (no routes).

    vLLM makes the directory absolute against its working directory (os.path.abspath(os.path.expanduser(d)):
    vllm==0.11.0:vllm/envs.py:836-838, vllm==0.34.0:vllm/config/profiler.py:234-236); `cwd` is the simulated
    server's (its temporary directory, removed with the host), so a relative directory in a scenario leaves nothing behind."""
    v, env = vllm_release(version), dict(spec.env)

    def absolute(d: str) -> str:
        d = os.path.expanduser(d)
        return os.path.abspath(d if os.path.isabs(d) or cwd is None else os.path.join(cwd, d))

    if v < VLLM_PROFILER_CONFIG_SINCE:
        d = env.get("VLLM_TORCH_PROFILER_DIR")
        if d:  # vllm==0.11.0:vllm/envs.py:835-838 (abspath of the value)
            iters = int(env.get("VLLM_PROFILER_MAX_ITERS", "0")) if v >= VLLM_WRAPPER_SINCE else 0  # vllm==0.12.0:vllm/envs.py:893
            gz = env.get("VLLM_TORCH_PROFILER_USE_GZIP", "1") != "0" if v >= VLLM_WRAPPER_SINCE else True
            return VllmProfilerSetting("torch", absolute(d), f"VLLM_TORCH_PROFILER_DIR={d}", iters, gz)
        if v >= VLLM_WRAPPER_SINCE and env.get("VLLM_TORCH_CUDA_PROFILE", "0") != "0":  # vllm==0.12.0:vllm/envs.py:841-843
            return VllmProfilerSetting("cuda", None, "VLLM_TORCH_CUDA_PROFILE=1")
        return None
    cfg = dict(spec.profiler_config or {})
    how = "--profiler-config " + json.dumps(cfg, separators=(",", ":")) if cfg else ""
    if v <= VLLM_ENV_IN_CONFIG_UNTIL:  # ProfilerConfig._validate_profiler_config (vllm==0.13.0:vllm/config/profiler.py:124-160)
        if "VLLM_TORCH_CUDA_PROFILE" in env:
            cfg["profiler"] = "cuda" if env["VLLM_TORCH_CUDA_PROFILE"] == "1" else None
            how = how or "VLLM_TORCH_CUDA_PROFILE=1"
        else:
            if "VLLM_TORCH_PROFILER_DIR" in env:
                cfg["torch_profiler_dir"] = env["VLLM_TORCH_PROFILER_DIR"]
                how = how or f"VLLM_TORCH_PROFILER_DIR={env['VLLM_TORCH_PROFILER_DIR']} (deprecated)"
            if cfg.get("torch_profiler_dir"):
                cfg["profiler"] = "torch"
                if "VLLM_TORCH_PROFILER_USE_GZIP" in env:
                    cfg["torch_profiler_use_gzip"] = env["VLLM_TORCH_PROFILER_USE_GZIP"] == "1"
        if "VLLM_PROFILER_MAX_ITERS" in env:
            cfg["max_iterations"] = int(env["VLLM_PROFILER_MAX_ITERS"])
    kind = cfg.get("profiler")
    if kind is None:
        return None
    d = str(cfg.get("torch_profiler_dir") or "")
    return VllmProfilerSetting(
        str(kind), absolute(d) if kind == "torch" and d else None, how,
        max_iterations=int(cfg.get("max_iterations") or 0), use_gzip=bool(cfg.get("torch_profiler_use_gzip", True)),
        frontend=not cfg.get("ignore_frontend", False), detailed=bool(cfg.get("detailed_trace_annotation", False)),
    )  # fmt: skip


def vllm_profiler_problem(version: str | None, spec: Any) -> str | None:
    """Why vLLM `version` would refuse to start with these profiler settings (a scenario that cannot be launched)."""
    v, cfg = vllm_release(version), dict(spec.profiler_config or {})
    if cfg and v < VLLM_PROFILER_CONFIG_SINCE:
        return f"--profiler-config is read from vLLM 0.13 (vllm/config/profiler.py); {version} enables its profiler with VLLM_TORCH_PROFILER_DIR"
    s = vllm_profiler_setting(version, spec)
    if s is not None and s.kind == "torch" and not s.directory:
        return "torch_profiler_dir must be set when profiler is 'torch' (vllm==0.34.0:vllm/config/profiler.py:229-230)"
    if cfg.get("torch_profiler_dir") and cfg.get("profiler") != "torch" and v > VLLM_ENV_IN_CONFIG_UNTIL:
        return "torch_profiler_dir is only applicable when profiler is set to 'torch' (vllm==0.34.0:vllm/config/profiler.py:225-228)"
    if s is not None and s.kind not in ("torch", "cuda", "proton"):
        return f"--profiler-config profiler {s.kind!r} is not one of torch, cuda, proton (vllm==0.34.0:vllm/config/profiler.py:14)"
    return None
