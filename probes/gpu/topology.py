"""`gpu.topology`: how the GPUs talk to each other: NVLink links, P2P status per pair, PCIe common ancestors."""

from __future__ import annotations

from typing import Any, Literal

from gpu_runbook.plugin import Context, Evidence, Probe, Table, Values, utcnow, value

from .common import GpuSelection, _nvlink_links, _open, _present, _Reader

# nvmlDeviceGetTopologyCommonAncestor levels, named as `nvidia-smi topo -m` does ("INT": same board).
TOPOLOGY_LEVELS = {0: "INT", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlDeviceGetP2PStatus results, named as `nvidia-smi topo -p2p` does.
P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2}  # literal ints: the binding's READ constant is a tuple


# "X" on the diagonal (a GPU and itself), else P2P_STATUS's names
P2PCell = Literal["X", "OK", "CNS", "GNS", "TNS", "DR", "NS", "U"]
Level = Literal["INT", "PIX", "PXB", "PHB", "NODE", "SYS"]


class P2PMatrices(Values):
    """nvmlDeviceGetP2PStatus per ordered pair: an NxN matrix per capability, in GPU order ("X" on the
    diagonal, None where the query is unsupported), or the whole matrix None when no pair answered."""

    read: list[list[P2PCell | None]] | None = value("P2P read status (nvidia-smi topo -p2p r)")
    write: list[list[P2PCell | None]] | None = value("P2P write status (nvidia-smi topo -p2p w)")
    nvlink: list[list[P2PCell | None]] | None = value("P2P over NVLink status (nvidia-smi topo -p2p n)")


class TopologyValues(Values):
    """gpu.topology: NVLink links, P2P status per GPU pair, and the PCIe common ancestor of each pair."""

    gpu_count: int = value("GPUs read", default=...)
    nvlink_link_count: list[int | None] = value("NVLink links per GPU (None where unknown)", unit="links", default=...)
    nvlink_active_links: list[int | None] = value("enabled NVLink links per GPU (None where unknown)", unit="links", default=...)
    nvlink_active_links_total: int | None = value("enabled NVLink links over all GPUs", unit="links")
    nvlink_supported: bool = value("any GPU has an NVLink link", default=...)
    p2p: P2PMatrices = value("P2P status matrices: read, write, nvlink", default=...)
    p2p_ok_pairs: int | None = value("unordered GPU pairs with read and write P2P OK; None when neither was read", unit="pairs")
    pairs_total: int = value("unordered GPU pairs, N*(N-1)/2", unit="pairs", default=...)
    pairs_without_p2p: int | None = value("unordered pairs where read or write P2P is not OK; None when neither was read", unit="pairs")
    any_pair_without_p2p: bool | None = value("some pair lacks read or write P2P; None when neither could be read")
    topology: list[list[str | None]] | None = value(
        "NxN common-ancestor matrix as nvidia-smi topo -m names it ('X', 'INT', 'PIX', 'PXB', 'PHB', 'NODE', 'SYS'; "
        "the level number for one it does not name; None where unsupported), or None when no pair answered")
    topology_worst: Level | None = value("the farthest path over all pairs (SYS > NODE > PHB > PXB > PIX > INT)")
    unsupported_calls: list[str] = value("NVML functions the device or driver lacks (sorted)", default=...)
    errors: dict[str, str] = value("NVML function -> unexpected error name", default=...)
    skipped_gpus: dict[str, str] = value("GPUs NVML lists but would not open: index -> NVML error name", default=...)


class TopologyParams(GpuSelection):
    pass


class GpuTopology(Probe):
    """How the GPUs talk to each other: NVLink links, P2P status per pair, PCIe common ancestors.

    The values are declared in `TopologyValues`.
    """

    name = "gpu.topology"
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
