"""`amd.topology`: how AMD GPUs reach each other: XGMI or PCIe per pair, and P2P access, from amdsmi.

It does the job `gpu.topology` names and fills its values (`TopologyValues`): P2P read and write are both
`amdsmi_is_P2P_accessible` (amdsmi 7.0.2 `amdsmi_interface.py:3353`; amdsmi has no separate read and write status),
and the link type of each pair is `amdsmi_topo_get_link_type` (0 internal, 1 PCIe, 2 XGMI: `amdsmi_wrapper.py:1231`),
as vLLM reads it to call a box fully connected (every pair one hop over XGMI; amd.md §4).
"""

from __future__ import annotations

from typing import Any

from gpu_runbook.plugin import Context, Evidence, Probe, Table, utcnow

from ..gpu_values import TopologyValues
from .common import AmdSelection, Reader, open_devices

LINK_TYPES = {0: "INTERNAL", 1: "PCIE", 2: "XGMI", 3: "N/A", 4: "UNKNOWN"}
FABRIC = ("XGMI", "INTERNAL")


class AmdTopology(Probe):
    """How AMD GPUs reach each other: the link type of each pair and P2P access (amdsmi)."""

    name = "amd.topology"
    gpu_vendor = "amd"
    gpu_role = "gpu.topology"
    prefetch = True
    description = "AMD GPUs: XGMI or PCIe link per pair and P2P access, from amdsmi"
    Params = AmdSelection
    Values = TopologyValues

    async def run(self, ctx: Context, params: Any) -> Evidence:
        started = utcnow()
        devs = await open_devices(ctx, params.gpus, started)
        if isinstance(devs, Evidence):
            return devs
        ds = devs.devices
        n = len(ds)

        def read(lib: Any) -> tuple[list[list[Any]], list[list[Any]], Reader]:
            r = Reader(lib)
            links: list[list[Any]] = []
            p2p: list[list[Any]] = []
            for i in range(n):
                lrow, prow = [], []
                for j in range(n):
                    if i == j:
                        lrow.append("X")
                        prow.append("X")
                        continue
                    link = r.q("amdsmi_topo_get_link_type", ds[i].handle, ds[j].handle)
                    lrow.append(LINK_TYPES.get(int(link["type"]), str(link["type"])) if isinstance(link, dict) else None)
                    ok = r.q("amdsmi_is_P2P_accessible", ds[i].handle, ds[j].handle)
                    prow.append(None if ok is None else "OK" if ok else "NS")
                links.append(lrow)
                p2p.append(prow)
            return links, p2p, r

        links, p2p, r = await ctx.gpu.amdsmi.call(read)  # type: ignore[union-attr]
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        answered = any(p2p[i][j] is not None for i, j in pairs)
        ok_pairs = without = 0
        for i, j in pairs:
            cells = [c for c in (p2p[i][j], p2p[j][i]) if c is not None]
            if cells and all(c == "OK" for c in cells):
                ok_pairs += 1
            elif cells:
                without += 1
        peers = [sum(1 for j in range(n) if j != i and links[i][j] in FABRIC) if any(links[i][j] is not None for j in range(n) if j != i) else None
                 for i in range(n)]  # fmt: skip
        known = [p for p in peers if p is not None]
        values = {
            "gpu_count": n,
            "nvlink_link_count": peers,
            "nvlink_active_links": peers,
            "nvlink_active_links_total": sum(known) if known else None,
            "nvlink_supported": any((p or 0) > 0 for p in peers),
            "p2p": {"read": p2p if answered or n == 1 else None, "write": p2p if answered or n == 1 else None, "nvlink": None},
            "p2p_ok_pairs": ok_pairs if answered else None,
            "pairs_total": len(pairs),
            "pairs_without_p2p": without if answered else None,
            "any_pair_without_p2p": (without > 0) if answered else None,
            "topology": None,
            "topology_worst": None,
            "link_types": links,
            "unsupported_calls": sorted(r.missing),
            "errors": dict(r.errors),
            "skipped_gpus": {str(k): v for k, v in devs.skipped.items()},
        }
        labels = [f"GPU{d.index}" for d in ds]
        blocks: list[Any] = [
            Table(title="Link type per pair (amdsmi_topo_get_link_type)", columns=["", *labels],
                  rows=[[labels[i], *[c or "-" for c in links[i]]] for i in range(n)]),
            Table(title="P2P access (amdsmi_is_P2P_accessible)", columns=["", *labels],
                  rows=[[labels[i], *[c or "-" for c in p2p[i]]] for i in range(n)]),
        ]  # fmt: skip
        xgmi = sum(1 for i, j in pairs if links[i][j] == "XGMI")
        p2p_text = ("P2P access unknown" if not answered else
                    f"P2P unavailable for {without} of {len(pairs)} GPU pairs" if without else f"P2P OK for all {len(pairs)} GPU pairs")
        summary = f"{n} GPUs, {xgmi} of {len(pairs)} pairs over XGMI, {p2p_text}"
        return Evidence(summary=summary, values=values, blocks=blocks, started_at=started, finished_at=utcnow())
