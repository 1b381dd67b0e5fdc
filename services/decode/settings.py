"""Settings of the decode service: the engine's limits, the preemption contract, chunking and the runaway guard."""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.runtime.common_settings import CommonSettings
from services.engine.config import EngineConfig, PreemptionMode
from services.runtime.settings_schema import SettingsError, setting


@dataclass(frozen=True, slots=True)
class DecodeSettings(CommonSettings):
    """Flags and environment of `voxmesh serve decode` (issue 4 item 6 names the first three knobs)."""

    kv_cache_blocks: int = setting(1024, "KV blocks in the paged pool (each holds every layer's K/V for block-size tokens)")
    gpu_memory_fraction: float = setting(
        0.0, "on CUDA: size the KV pool so this process holds at most this fraction of the card's total memory "
             "(weights, pool and graphs); 0: use --kv-cache-blocks")
    max_num_seqs: int = setting(64, "most requests decoding at once; decode pulls from REQUESTS only below this")
    interactive_share: float = setting(
        0.25, "share of --max-num-seqs kept for interactive requests (rounded up, at most all seats but one): batch "
              "requests never hold those, so an interactive request within the share gets a seat at once")
    recompute_preemption: str = setting(
        "allow", "when the KV pool is full: allow (re-queue, replay faithfully) or fail (end with code preempted)",
        choices=("allow", "fail"))
    block_size: int = setting(16, "tokens per KV block")
    max_num_batched_tokens: int = setting(2048, "most new tokens in one engine step (prefill chunks + 1 per decode)")
    max_model_len: int = setting(4096, "most tokens (prompt + frames) one request may reach")
    initial_chunk_frames: int = setting(2, "frames in a request's first codes chunk (low first-packet latency)")
    one_frame_first_chunk_below: int = setting(
        32, "a request that names no first chunk size gets a one-frame first chunk while fewer than this many requests "
           "run on the replica (its first audio a step sooner where the device has room; 0: never), else "
           "--initial-chunk-frames")
    chunk_frames: int = setting(8, "largest codes chunk: chunk sizes ramp initial, initial, 2x, 4x ... up to this")
    runaway_min_frames: int = setting(60, "runaway guard: frames any text may reach (60 frames = 4.8 s of audio)")
    runaway_frames_per_char: float = setting(
        4.0, "runaway guard: extra frames per character of text (4.0 = 0.32 s of audio per character)")
    max_new_frames: int = setting(2048, "hard cap on frames per request, whatever the text or the request asks")
    steps_queued: int = setting(
        2, "engine step calls kept in the engine thread's queue: 2 lets it start the next step the moment one "
           "returns, without waiting for the event loop (aborts wait one step longer; 1: the loop hands over each "
           "step, and the engine thread idles between steps while the loop is busy)")
    cuda_graphs: bool = setting(True, "on CUDA, replay decode-only steps as CUDA graphs (one per batch bucket)")
    overlap_min_rows: int = setting(
        32, "on CUDA, launch the next step before the running one's codes are read only for steps of at least this "
            "many requests (0: every step): a smaller step is read at once, so a request that arrives meanwhile "
            "starts one step sooner, at the price of the host's launch time in every such step")
    late_launch: bool = setting(
        True, "with overlapped steps, queue the next step only when the running one is about to end (by the recent "
               "steps' device and launch times) or at once when a request arrives, not as soon as the running one "
               "began: a request that arrives meanwhile starts one step sooner")
    max_migrations: int = setting(
        1, "times a request may be taken over from a dead decode replica and continued from its frames in CODES; "
           "past this it fails with code replica_lost (a request that crashes its replica must not crash them all)")
    mtp_replicas: int = setting(
        0, "0: the code predictor runs in this process; k >= 1: codebooks 1..15 come from remote mtp replicas (the "
           "mtp topology), and decode waits for k of them to be live before it serves")
    mtp_timeout_s: float = setting(5.0, "mtp topology: seconds one mtp replica gets to answer a step before it is "
                                        "resent to another")
    mtp_attempts: int = setting(3, "mtp topology: replicas one step is sent to before its requests fail")
    handoff_timeout_s: float = setting(
        10.0, "watchdog of a remotely prefilled prompt's KV fetch (by UCX): past it the prompt is prefilled here")
    voice_work: str = setting(
        "auto", "base checkpoints: where reference audio becomes a voice prompt: a child process (process), a thread "
                "of this one (thread), or auto (a process on CUDA, where that work is launch-bound Python that would "
                "hold the interpreter lock the step loop needs)", choices=("auto", "thread", "process"))
    voice_workers: int = setting(
        2, "base checkpoints, voice work in processes: how many child processes compute voice prompts at once (each "
           "loads its own encoders and, on CUDA, its own context of a few hundred MiB)")
    shutdown_grace_s: float = setting(30.0, "on SIGTERM: seconds owned requests get to finish before they end drained")
    metrics_port: int = setting(0, "port of the Prometheus /metrics listener (0: off)",
                                env="VOXMESH_DECODE_METRICS_PORT")
    metrics_host: str = setting("127.0.0.1", "address the /metrics listener binds (loopback by default; 0.0.0.0 "
                                "lets another host scrape it)", env="VOXMESH_DECODE_METRICS_HOST")

    def __post_init__(self) -> None:
        for name in ("kv_cache_blocks", "max_num_seqs", "block_size", "max_num_batched_tokens", "max_model_len",
                     "initial_chunk_frames", "chunk_frames", "runaway_min_frames", "max_new_frames",
                     "num_partitions", "torch_threads", "steps_queued", "voice_workers"):
            if getattr(self, name) < 1:
                raise SettingsError(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(self, name)}")
        for name, zero_means in (("one_frame_first_chunk_below", "never"), ("overlap_min_rows", "every step overlaps"),
                                 ("max_migrations", "never migrate")):
            if getattr(self, name) < 0:
                raise SettingsError(f"--{name.replace('_', '-')}: must be >= 0 (0: {zero_means}), "
                                    f"got {getattr(self, name)}")
        if not 0 <= self.metrics_port <= 65535:
            raise SettingsError(f"--metrics-port / VOXMESH_DECODE_METRICS_PORT: {self.metrics_port} is not a TCP "
                                "port (0..65535; 0: off)")
        if not (math.isfinite(self.gpu_memory_fraction) and 0 <= self.gpu_memory_fraction <= 1):
            raise SettingsError(f"--gpu-memory-fraction: must be in [0, 1] (0: use --kv-cache-blocks), "
                                f"got {self.gpu_memory_fraction}")
        if self.gpu_memory_fraction > 0 and not self.device.startswith("cuda"):
            raise SettingsError(f"--gpu-memory-fraction needs a CUDA --device (got {self.device}); "
                                "set --kv-cache-blocks instead")
        if self.mtp_replicas < 0 or self.mtp_attempts < 1:
            raise SettingsError(f"--mtp-replicas ({self.mtp_replicas}) must be >= 0 and --mtp-attempts "
                                f"({self.mtp_attempts}) >= 1")
        if not (math.isfinite(self.mtp_timeout_s) and self.mtp_timeout_s > 0):
            raise SettingsError(f"--mtp-timeout-s: must be a finite number > 0, got {self.mtp_timeout_s}")
        if not (math.isfinite(self.handoff_timeout_s) and self.handoff_timeout_s > 0):
            raise SettingsError(f"--handoff-timeout-s: must be a finite number > 0, got {self.handoff_timeout_s}")
        if not (math.isfinite(self.shutdown_grace_s) and self.shutdown_grace_s >= 0):
            raise SettingsError(f"--shutdown-grace-s: must be a finite number >= 0, got {self.shutdown_grace_s}")
        if not (math.isfinite(self.runaway_frames_per_char) and self.runaway_frames_per_char >= 0):
            raise SettingsError(f"--runaway-frames-per-char: must be a finite number >= 0, "
                                f"got {self.runaway_frames_per_char}")
        if not (math.isfinite(self.interactive_share) and 0 <= self.interactive_share <= 1):
            raise SettingsError(f"--interactive-share: must be in [0, 1], got {self.interactive_share}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise SettingsError(f"--max-num-batched-tokens ({self.max_num_batched_tokens}) must be >= --max-num-seqs "
                                f"({self.max_num_seqs}): every running request needs one token per step")

    def interactive_seats_of(self) -> int:
        """Seats kept for interactive requests: the share of max_num_seqs rounded up, leaving batch at least one."""
        return min(math.ceil(self.interactive_share * self.max_num_seqs), self.max_num_seqs - 1)

    @property
    def preemption_mode(self) -> PreemptionMode:
        return PreemptionMode(self.recompute_preemption)

    def engine_config(self) -> EngineConfig:
        """The engine's limits from these settings."""
        by_fraction = self.gpu_memory_fraction > 0
        return EngineConfig(kv_cache_blocks=None if by_fraction else self.kv_cache_blocks,
                            gpu_memory_fraction=self.gpu_memory_fraction if by_fraction else None,
                            block_size=self.block_size,
                            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                            max_model_len=self.max_model_len, cuda_graphs=self.cuda_graphs,
                            overlap_min_rows=self.overlap_min_rows, late_launch=self.late_launch)

    def frame_budget(self, text_chars: int, requested: int | None) -> int:
        """Most frames a request may produce: the runaway guard (DESIGN.md invariant 7), the request's own cap and
        the service's hard cap, whichever is lowest. Random weights never emit EOS; real models sometimes miss it."""
        guard = self.runaway_min_frames + math.ceil(self.runaway_frames_per_char * text_chars)
        caps = [guard, self.max_new_frames] + ([requested] if requested is not None else [])
        return min(caps)
