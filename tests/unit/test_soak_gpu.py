"""The soak's GPU sample (loadtest/soak/gpu_samples.py) read from nvidia-smi's CSV as it prints it, its verdict
(gpu_flatness.py), and the overall verdict with the GPU, the latencies and failed requests in it."""

from __future__ import annotations

import pytest

from loadtest.soak.bus_samples import BusSample
from loadtest.soak.flatness import MEMORY_TOLERANCE, Moment, gpu_verdict, is_flat, markdown
from loadtest.soak.gpu_flatness import markdown_lines
from loadtest.soak.gpu_samples import (
    CardSample,
    GpuSample,
    SmiOutputError,
    name_processes,
    parse_apps,
    parse_cards,
)

# nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits (two H100s)
CARDS = "0, 61234, 81559\n1, 4, 81559\n"
# nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits (decode on both cards, a stranger)
APPS = "4121, 58000\n4122, 2600\n4121, 900\n777, 512\n"
MESH = {"up": 4100, "nats-server": 4101, "gateway": 4120, "decode": 4121, "vocoder": 4122}


def test_cards_and_processes_are_read_from_nvidia_smis_csv():
    assert parse_cards(CARDS) == [CardSample(0, 61234, 81559), CardSample(1, 4, 81559)]
    assert parse_cards("0, [N/A], 81559") == [CardSample(0, None, 81559)]
    assert parse_apps(APPS) == {4121: 58900, 4122: 2600, 777: 512}
    assert parse_apps("") == {} and parse_apps("\n") == {}, "no compute process: an empty answer"
    assert parse_apps("4121, [N/A]\n") == {4121: 0}
    with pytest.raises(SmiOutputError):
        parse_cards("0, 61234")
    with pytest.raises(SmiOutputError):
        parse_apps("No running processes found, 0")


def test_pids_are_named_as_the_mesh_names_them():
    named, other_mib, others = name_processes(parse_apps(APPS), MESH)
    assert named == {"decode": 58900, "vocoder": 2600} and other_mib == 512 and others == [777]


def gpu(decode_mib: int, card_mib: int, vocoder_mib: int | None = 2600) -> GpuSample:
    processes = {"decode": decode_mib} | ({} if vocoder_mib is None else {"vocoder": vocoder_mib})
    return GpuSample(available=True, cards=[CardSample(0, card_mib, 81559)], processes=processes)


def moment(sample: GpuSample | None) -> Moment:
    return Moment({}, BusSample(), {"gateway_live_requests": 0}, sample)


def test_gpu_memory_within_five_percent_is_flat_and_past_it_is_not():
    assert MEMORY_TOLERANCE == 0.05
    flat = gpu_verdict(moment(gpu(58000, 61000)), moment(gpu(60000, 63000)))
    assert flat["available"] and flat["flat"]
    assert [row["change"] for row in flat["processes"]] == pytest.approx([2000 / 58000, 0.0])
    grown = gpu_verdict(moment(gpu(58000, 61000)), moment(gpu(62000, 65000)))
    assert not grown["flat"] and [row["flat"] for row in grown["cards"]] == [False]
    appeared = gpu_verdict(moment(gpu(58000, 61000, vocoder_mib=None)), moment(gpu(58000, 61000)))
    assert not appeared["flat"], "a process that took GPU memory only during the soak grew"
    lines = markdown_lines(grown)
    assert "| card 0 (of 81559 MiB) | 61000 MiB -> 65000 MiB | +6.6% | NO |" in lines
    assert "| decode | 58000 MiB -> 62000 MiB | +6.9% | NO |" in lines


def test_without_nvidia_smi_the_gpu_is_not_judged():
    absent = GpuSample(available=False, reason="no GPU: nvidia-smi is not on PATH")
    verdict = gpu_verdict(moment(absent), moment(absent))
    assert verdict == {"available": False, "reason": "no GPU: nvidia-smi is not on PATH", "flat": None,
                       "cards": [], "processes": [], "notes": []}
    assert markdown_lines(verdict) == ["GPU: no GPU: nvidia-smi is not on PATH (not judged)."]
    assert is_flat([], [], [], gpu=verdict)
    assert not gpu_verdict(moment(None), moment(None))["available"]


def test_no_error_flat_latencies_and_a_flat_gpu_are_part_of_flat():
    assert is_flat([], [], [])
    assert not is_flat([], [], [], requests_failed=1), "a failed request is not flat"
    assert not is_flat([], [], [], latency={"flat": False})
    assert not is_flat([], [], [], gpu=gpu_verdict(moment(gpu(58000, 61000)), moment(gpu(70000, 73000))))


def test_the_markdown_says_the_load_and_gains_the_gpu_and_latency_tables():
    run = {"command": "python -m loadtest.soak --rate 28", "date": "today", "commit": "abc", "duration_s": 600,
           "warmup_s": 60, "load": "open loop at 28/s", "concurrency": None, "fixed_frames": None,
           "requests_completed": 16790, "requests_failed": 0, "requests_cut_off": 3, "warmup_requests_failed": 0,
           "requests_per_s": 28.0, "audio_s_per_s": 126.0, "machine": "16 CPUs"}
    latency = {"first_window_s": [0.0, 60.0], "last_window_s": [540.0, 600.0], "ratio": 1.25, "slack_s": 0.005,
               "flat": True, "notes": [], "rows": [
                   {"figure": "first_audible_s", "first": {"count": 1680, "p50_s": 0.031, "p95_s": 0.044},
                    "last": {"count": 1675, "p50_s": 0.032, "p95_s": 0.046}, "p95_bound_s": 0.06, "flat": True}]}
    document = {"run": run, "flat": True, "processes": [], "streams": [], "consumers": [],
                "gpu": gpu_verdict(moment(gpu(58000, 61000)), moment(gpu(58100, 61100))), "latency": latency}
    table = markdown(document)
    assert "(open loop at 28/s, the length the bench's flags pick)" in table
    assert "| decode | 58000 MiB -> 58100 MiB | +0.2% | yes |" in table
    assert "| first_audible_s | 1680, 31.0 ms / 44.0 ms | 1675, 32.0 ms / 46.0 ms | 60.0 ms | yes |" in table
