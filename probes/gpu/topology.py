"""`gpu.topology`: how the GPUs talk to each other: NVLink links, P2P status per pair, PCIe common ancestors."""

from __future__ import annotations

from typing import Any

from gpu_runbook.plugin import Context, Evidence, Probe, Table, utcnow

from ..gpu_values import TopologyValues
from .common import GpuSelection, _nvlink_links, _open, _present, _Reader

# nvmlDeviceGetTopologyCommonAncestor levels, named as `nvidia-smi topo -m` does ("INT": same board).
TOPOLOGY_LEVELS = {0: "INT", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlDeviceGetP2PStatus results, named as `nvidia-smi topo -p2p` does.
P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2}  # literal ints: the binding's READ constant is a tuple


class TopologyParams(GpuSelection):
    pass


class GpuTopology(Probe):
    """How the GPUs talk to each other: NVLink links, P2P status per pair, PCIe common ancestors.

    The values are declared in `TopologyValues`.
    """

    name = "gpu.topology"
    gpu_vendor = "nvidia"  # on an AMD host the amd family does this job (Registry.for_target)
    prefetch = True
    description = "NVLink links, P2P read/write/NVLink status per GPU pair, PCIe topology matrix"
    Params = TopologyParams
    Values = TopologyValues

    async def run(self, ctx: Context, params: Any) -> Evidence:
        started = utcnow()
        devs = await _open(ctx, params.gpus, started)
        if isinstance(devs, Evidence):
            return devs
        ds = devs.devices
        n = len(ds)

        def read(lib: Any) -> tuple[list[tuple[Any, Any]], dict[str, Any], Any, _Reader]:
            r = _Reader(lib)
            links = [_nvlink_links(r, d.handle) for d in ds]
            p2p: dict[str, Any] = {}
            for cap, idx in P2P_CAPS.items():
                m = [["X" if i == j else _p2p_name(r.q("nvmlDeviceGetP2PStatus", ds[i].handle, ds[j].handle, idx))
                      for j in range(n)] for i in range(n)]
                answered = any(m[i][j] is not None for i in range(n) for j in range(n) if i != j)
                p2p[cap] = m if answered or n == 1 else None
            topo = [["X" if i == j else _level_name(r.q("nvmlDeviceGetTopologyCommonAncestor", ds[i].handle, ds[j].handle))
                     for j in range(n)] for i in range(n)]
            answered = any(topo[i][j] is not None for i in range(n) for j in range(n) if i != j)
            return links, p2p, topo if answered or n == 1 else None, r

        links, p2p, topo, r = await ctx.nvml.call(read)
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        read_m, write_m = p2p["read"], p2p["write"]
        ok_pairs = without = 0
        known = read_m is not None or write_m is not None
        for i, j in pairs:
            cells = [m[i][j] for m in (read_m, write_m) if m is not None] + \
                    [m[j][i] for m in (read_m, write_m) if m is not None]
            cells = _present(cells)
            if cells and all(c == "OK" for c in cells):
                ok_pairs += 1
            elif cells:
                without += 1
        counts = [c for c, _ in links]
        actives = [a for _, a in links]
        worst = None
        if topo is not None:
            order = ["INT", "PIX", "PXB", "PHB", "NODE", "SYS"]
            levels = [topo[i][j] for i, j in pairs if topo[i][j] in order]
            worst = max(levels, key=order.index) if levels else None
        values = {
            "gpu_count": n,
            "nvlink_link_count": counts,
            "nvlink_active_links": actives,
            "nvlink_active_links_total": sum(_present(actives)) if _present(actives) else None,
            "nvlink_supported": any((c or 0) > 0 for c in counts),
            "p2p": p2p,
            "p2p_ok_pairs": ok_pairs if known else None,
            "pairs_total": len(pairs),
            "pairs_without_p2p": without if known else None,
            "any_pair_without_p2p": (without > 0) if known else None,
            "topology": topo,
            "topology_worst": worst,
            "unsupported_calls": sorted(r.missing),
            "errors": dict(r.errors),
            "skipped_gpus": {str(k): v for k, v in devs.skipped.items()},
        }
        labels = [f"GPU{d.index}" for d in ds]
        blocks: list[Any] = []
        for cap in ("read", "write", "nvlink"):
            if p2p[cap] is not None:
                blocks.append(Table(title=f"P2P {cap} status", columns=["", *labels],
                                    rows=[[labels[i], *[c or "-" for c in p2p[cap][i]]] for i in range(n)]))
        if topo is not None:
            blocks.append(Table(title="PCIe topology (common ancestor)", columns=["", *labels],
                                rows=[[labels[i], *[c or "-" for c in topo[i]]] for i in range(n)]))
        blocks.append(Table(title="NVLink", columns=["GPU", "links", "active"],
                            rows=[[labels[i], counts[i], actives[i]] for i in range(n)]))
        p2p_text = ("P2P status unknown" if not known else
                    f"P2P unavailable for {without} of {len(pairs)} GPU pairs" if without else
                    f"P2P OK for all {len(pairs)} GPU pairs")
        summary = (f"{n} GPUs, NVLink active links {values['nvlink_active_links_total']}, {p2p_text}"
                   + (f", farthest path {worst}" if worst else ""))
        return Evidence(summary=summary, values=values, blocks=blocks, started_at=started, finished_at=utcnow())


def _p2p_name(status: int | None) -> str | None:
    return None if status is None else P2P_STATUS.get(int(status), "U")


def _level_name(level: int | None) -> str | None:
    return None if level is None else TOPOLOGY_LEVELS.get(int(level), str(level))
