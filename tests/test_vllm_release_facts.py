"""vLLM release boundaries corrected in issue 33, each read in the sdists (probes/vllm/facts.py cites the files): the
GB10 small default tier is applied from 0.33.0, cache_config_info's KV-size labels arrive in 0.24.0, TPOT is hidden
from 0.12.0 and gone by 0.16.0. The simulated server and the probe read the same table."""

from __future__ import annotations

from gpu_runbook.probes.vllm import facts


def test_gb10_stays_on_the_small_default_tier_from_0_33() -> None:
    # GB10 (DGX Spark): ~120 GiB of unified memory, yet 256 from 0.33.0 (engine/arg_utils.py is_gb10); 1024 before
    assert facts.default_max_num_seqs("0.34.0", 119.7, "NVIDIA GB10") == 256
    assert facts.default_max_num_seqs("0.33.0", 119.7, "NVIDIA GB10") == 256
    assert facts.default_max_num_seqs("0.32.0", 119.7, "NVIDIA GB10") == 1024
    # the other GPUs are untouched: an RTX PRO 6000 (95.6 GiB) and an H200 get 1024, an A100 256
    assert facts.default_max_num_seqs("0.34.0", 95.6, "NVIDIA RTX PRO 6000 Blackwell Server Edition") == 1024
    assert facts.default_max_num_seqs("0.34.0", 139.8, "NVIDIA H200") == 1024
    assert facts.default_max_num_seqs("0.34.0", 79.2, "NVIDIA A100-SXM4-80GB") == 256


def test_release_boundaries_read_in_the_sdists() -> None:
    assert facts.KV_SIZE_LABELS_SINCE == "0.24.0"
    assert facts.at_least("0.23.0", facts.KV_SIZE_LABELS_SINCE) is False and facts.at_least("0.24.0", facts.KV_SIZE_LABELS_SINCE)
    assert facts.TPOT_HIDDEN_SINCE == "0.12.0"
    assert facts.at_least("0.14.0", "0.15.99") is False and facts.at_least("0.16.0", facts.TPOT_UNTIL)
