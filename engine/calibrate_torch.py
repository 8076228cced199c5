"""The real load of `runbook calibrate`: PyTorch on the GPU, imported only when a calibration runs.

PyTorch is always on an inference host (SGLang and vLLM need it) and never a dependency of runbook, so this
module is the one place that imports it, and only when `TorchLoad.open` is called.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .gpu_load import GpuIdentity, LoadUnavailable, Window, one_line

HIDDEN = 8192  # the decode GEMMs' weights are HIDDEN x HIDDEN, as a 70B-class model's projections
LAYERS = 64  # 64 x 8192^2 bf16 = 8.6 GB: every pass streams them from HBM, far past any L2
COPY_BYTES = 4 << 30
CHUNK_S = 0.05  # GPU work queued between two looks at the clock


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


@dataclass
class _Weights:
    dtype: str
    layers: list[Any]
    scales: list[Any] = field(default_factory=list)  # FP4's per-layer block scales


class TorchLoad:
    """The loads through PyTorch, on the CUDA device that is NVML's GPU (matched by UUID, else PCI bus id:
    CUDA's order and CUDA_VISIBLE_DEVICES need not be NVML's). Every GEMM pass is a CUDA graph, so an FP8
    GEMM of 20 us is not waiting on Python to launch the next."""

    def __init__(self, torch: Any, device: int) -> None:
        self.torch = torch
        self.device = torch.device("cuda", device)
        self.cc: tuple[int, int] = tuple(torch.cuda.get_device_capability(device))  # type: ignore[assignment]
        self._dtypes: list[str] | None = None
        self._notes: list[str] = []
        self._weights: _Weights | None = None
        self._fp8_rows = 1  # an FP8 GEMM's rows are padded to this multiple where cuBLAS asks for it
        self._fp4_rows = 1

    @classmethod
    def open(cls, ident: GpuIdentity) -> "TorchLoad":
        try:
            import torch  # noqa: PLC0415 - lazy on purpose: never a dependency of the base install
        except ImportError:
            raise LoadUnavailable(
                "PyTorch is not importable here, and it runs the loads: `pip install torch`, or run `runbook calibrate` "
                "in the inference server's Python environment (SGLang and vLLM install it)"
            ) from None
        except Exception as exc:  # noqa: BLE001 - a broken install (missing CUDA libraries) says so in one line
            raise LoadUnavailable(f"PyTorch could not be imported: {type(exc).__name__}: {one_line(exc)}") from None
        if not torch.cuda.is_available():
            raise LoadUnavailable(
                f"PyTorch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda or 'none: a CPU-only build'}; "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')})"
            )
        device = cls._find(torch, ident)
        torch.cuda.set_device(device)
        return cls(torch, device)

    @staticmethod
    def _find(torch: Any, ident: GpuIdentity) -> int:
        want_uuid = (ident.uuid or "").lower().removeprefix("gpu-").removeprefix("mig-")
        want_pci = _pci_key(ident.pci_bus_id)
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            uuid = str(getattr(props, "uuid", "") or "").lower().removeprefix("gpu-")
            if want_uuid and uuid and uuid == want_uuid:
                return i
            pci = (getattr(props, "pci_domain_id", None), getattr(props, "pci_bus_id", None), getattr(props, "pci_device_id", None))
            if want_pci is not None and None not in pci and pci == want_pci:
                return i
        raise LoadUnavailable(
            f"GPU {ident.index} ({ident.uuid or ident.pci_bus_id or ident.name}) is not one PyTorch sees here "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')})"
        )

    def describe(self) -> str:
        return f"torch {self.torch.__version__}"

    def dtypes(self) -> list[str]:
        if self._dtypes is None:
            self._dtypes = ["bf16"]
            for dtype, probe in (("fp8", self._probe_fp8), ("fp4", self._probe_fp4)):
                why = probe()
                if why is None:
                    self._dtypes.append(dtype)
                else:
                    self._notes.append(f"{dtype}: left out: {why}")
        return list(self._dtypes)

    def notes(self) -> list[str]:
        self.dtypes()
        return list(self._notes)

    def close(self) -> None:
        self._weights = None
        self.torch.cuda.empty_cache()

    # -- which dtypes run here --

    def _probe_fp8(self) -> str | None:
        torch = self.torch
        if self.cc < (8, 9):
            return f"compute capability {self.cc[0]}.{self.cc[1]} has no FP8 tensor cores (8.9 and later do)"
        if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            return f"torch {torch.__version__} has no FP8 GEMM (torch._scaled_mm)"
        return self._probe_rows("fp8", lambda rows: self._gemm_fn("fp8", self._weight("fp8", rows, 256), self._weight("fp8", 256, 256))[0])

    def _probe_fp4(self) -> str | None:
        torch = self.torch
        if self.cc < (10, 0):
            return f"compute capability {self.cc[0]}.{self.cc[1]} has no FP4 tensor cores (Blackwell, 10.0 and later, does)"
        if not hasattr(torch, "float4_e2m1fn_x2") or not hasattr(torch, "_scaled_mm"):
            return f"torch {torch.__version__} has no FP4 GEMM (torch.float4_e2m1fn_x2 with torch._scaled_mm)"
        return self._probe_rows("fp4", lambda rows: self._gemm_fn("fp4", self._weight("fp4", rows, 256), self._weight("fp4", 256, 256))[0])

    def _probe_rows(self, dtype: str, make: Callable[[int], Callable[[], Any]]) -> str | None:
        """Run a small GEMM of 1 row, else of 16 or 128 (cuBLAS may want the rows padded): the first that runs
        sets the padding; none running leaves the dtype out, with the error."""
        error: BaseException | None = None
        for rows in (1, 16, 128):
            try:
                make(rows)()
                self.torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - the reason it is left out
                error = error or exc
                continue
            setattr(self, f"_{dtype}_rows", rows)
            return None
        assert error is not None
        return f"torch._scaled_mm refused it here ({type(error).__name__}: {one_line(error, 200)})"

    # -- tensors --

    def _weight(self, dtype: str, n: int, k: int) -> Any:
        """One n x k weight matrix (row-major, used transposed: the column-major operand cuBLAS's FP8 wants)."""
        torch = self.torch
        if dtype == "bf16":
            return torch.randn(n, k, device=self.device, dtype=torch.bfloat16)
        if dtype == "fp8":
            return torch.randn(n, k, device=self.device, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
        data = torch.randint(0, 256, (n, k // 2), device=self.device, dtype=torch.uint8)
        return data.view(torch.float4_e2m1fn_x2)

    def _fp4_scales(self, rows: int, k: int) -> Any:
        """NVFP4's block scales (one FP8 per 16 values), in cuBLAS's swizzled layout: rows padded to 128, blocks to 4."""
        torch = self.torch
        return torch.ones(_round_up(rows, 128) * _round_up(k // 16, 4), device=self.device).to(torch.float8_e4m3fn)

    def _gemm_fn(self, dtype: str, x: Any, w: Any, out: Any = None, w_scale: Any = None) -> tuple[Callable[[], Any], Any]:
        """A callable doing x @ w.T in `dtype` (bf16: torch.mm; FP8/FP4: torch._scaled_mm, bf16 out)."""
        torch = self.torch
        if dtype == "bf16":
            out = out if out is not None else torch.empty(x.shape[0], w.shape[0], device=self.device, dtype=torch.bfloat16)
            return (lambda: torch.mm(x, w.t(), out=out)), out
        if dtype == "fp8":
            one = torch.ones((), device=self.device, dtype=torch.float32)
            return (lambda: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)), None
        k = x.shape[1] * 2
        a_scale = self._fp4_scales(x.shape[0], k)
        b_scale = w_scale if w_scale is not None else self._fp4_scales(w.shape[0], k)
        return (lambda: torch._scaled_mm(x, w.t(), scale_a=a_scale, scale_b=b_scale, out_dtype=torch.bfloat16)), None

    def _layers(self, dtype: str) -> _Weights:
        """LAYERS weight matrices of `dtype`, fewer where free memory is short; kept for every batch of the dtype."""
        from .calibration import WEIGHT_BYTES  # noqa: PLC0415

        if self._weights is not None and self._weights.dtype == dtype:
            return self._weights
        self.close()
        free, _total = self.torch.cuda.mem_get_info(self.device)
        per_layer = HIDDEN * HIDDEN * WEIGHT_BYTES[dtype]
        count = max(2, min(LAYERS, int(0.6 * free // per_layer)))
        layers = [self._weight(dtype, HIDDEN, HIDDEN) for _ in range(count)]
        scales = [self._fp4_scales(HIDDEN, HIDDEN) for _ in range(count)] if dtype == "fp4" else []
        self._weights = _Weights(dtype, layers, scales)
        return self._weights

    # -- the loads --

    def copy(self, window: Window) -> dict[str, float]:
        torch = self.torch
        self.close()
        free, _total = torch.cuda.mem_get_info(self.device)
        nbytes = max(64 << 20, min(COPY_BYTES, int(0.4 * free) // 2 >> 20 << 20))
        # bf16 drawn like weights, as the GEMMs' are: what HBM draws depends on the bits it moves (an H200 copying
        # uniform random bytes drew ~610 W, zeros ~405 W, at the same 4.3 TB/s)
        src = torch.randn(nbytes // 2, device=self.device, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        try:
            timing = self._run(lambda: dst.copy_(src), window)
        finally:
            src = dst = None  # 8 GiB back before the next load
            torch.cuda.empty_cache()
        return {"gbps": 2 * nbytes * timing["steps_per_s"] / 1e9, "seconds": timing["seconds"]}

    def decode_gemm(self, dtype: str, batch: int, window: Window) -> dict[str, float]:
        from .calibration import WEIGHT_BYTES  # noqa: PLC0415

        torch = self.torch
        weights = self._layers(dtype)
        multiple = {"fp8": self._fp8_rows, "fp4": self._fp4_rows}.get(dtype, 1)
        rows = _round_up(batch, multiple)
        x = self._weight(dtype, rows, HIDDEN)
        out = torch.empty(rows, HIDDEN, device=self.device, dtype=torch.bfloat16) if dtype == "bf16" else None
        gemms = [self._gemm_fn(dtype, x, w, out, weights.scales[i] if weights.scales else None)[0] for i, w in enumerate(weights.layers)]

        def one_pass() -> None:
            for gemm in gemms:
                gemm()

        step = self._graph(one_pass)
        timing = self._run(step, window)
        n = len(weights.layers)
        passes = timing["steps_per_s"]
        return {
            "gbps": n * HIDDEN * HIDDEN * WEIGHT_BYTES[dtype] * passes / 1e9,
            "tflops": 2.0 * batch * HIDDEN * HIDDEN * n * passes / 1e12,  # the batch's rows, not the padding
            "seconds": timing["seconds"],
        }

    def compute_gemm(self, dtype: str, window: Window) -> dict[str, float]:
        torch = self.torch
        self.close()
        a = self._weight(dtype, HIDDEN, HIDDEN)
        b = self._weight(dtype, HIDDEN, HIDDEN)
        step = self._graph(self._gemm_fn(dtype, a, b)[0])
        try:
            timing = self._run(step, window)
        finally:
            a = b = step = None
            torch.cuda.empty_cache()
        return {"tflops": 2.0 * HIDDEN**3 * timing["steps_per_s"] / 1e12, "rows": float(HIDDEN), "seconds": timing["seconds"]}

    def _graph(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """`fn` captured as a CUDA graph (warmed on a side stream first, as torch asks); `fn` itself where
        capture fails."""
        torch = self.torch
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            return graph.replay
        except Exception:  # noqa: BLE001 - launched one kernel at a time instead: slower to launch, same work
            torch.cuda.synchronize()
            return fn

    def _run(self, step: Callable[[], Any], window: Window) -> dict[str, float]:
        """Run `step` for warmup_s + seconds after setup; the rate over the steps launched after the warm-up,
        timed by CUDA events from the first such step's start to the last one's end (gaps included)."""
        torch = self.torch
        step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        per_chunk = max(1, int(CHUNK_S / max(time.perf_counter() - t0, 1e-6)))
        window.started()
        begin = time.monotonic()
        measure_from, end = begin + window.warmup_s, begin + window.warmup_s + window.seconds
        first = last = None
        steps = 0
        previous = None
        while True:
            launched = time.monotonic()
            start_ev = torch.cuda.Event(enable_timing=True)
            end_ev = torch.cuda.Event(enable_timing=True)
            start_ev.record()
            for _ in range(per_chunk):
                step()
            end_ev.record()
            if launched >= measure_from:
                first = start_ev if first is None else first
                last = end_ev
                steps += per_chunk
            if previous is not None:
                previous.synchronize()  # one chunk queued behind the one running: the GPU never waits on us
            previous = end_ev
            if launched >= end:
                break
        torch.cuda.synchronize()
        assert first is not None and last is not None
        seconds = first.elapsed_time(last) / 1000.0
        return {"steps_per_s": steps / seconds if seconds > 0 else float("nan"), "seconds": seconds}


def _pci_key(bus_id: str | None) -> tuple[int, int, int] | None:
    """NVML's "00000000:18:00.0" as (domain, bus, device), as torch's device properties give them."""
    if not bus_id:
        return None
    try:
        domain, bus, rest = bus_id.split(":")
        return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except ValueError:
        return None
