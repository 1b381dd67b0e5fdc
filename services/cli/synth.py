"""`voxmesh synth`: synthesize one text offline, without the bus, into a 24 kHz mono 16-bit WAV.

It runs the same model entry points as the services (prompt, talker prefill and decode over a paged pool,
the code-predictor step, the keyed sampler, the codec decoder), so it is the oracle for the mesh: a greedy
or seeded request through the mesh gives the codes this gives. Defaults follow the reference's high-level
API: non-streaming text mode and the sampling values of the checkpoint's generation_config.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import secrets
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from services.model.loader import DTYPES

if TYPE_CHECKING:
    from services.model.codec.decoder import CodecDecoder
    from services.model.voice.voice_prompt import VoicePrompt

TEXT_MODES = ("non-streaming", "streaming")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, required=True, help="checkpoint directory")
    parser.add_argument("--text", required=True, help="what to say")
    parser.add_argument("--speaker", default=None, help="a speaker of a custom_voice checkpoint")
    parser.add_argument("--language", default="auto", help="'auto' (default) or a language of the checkpoint")
    parser.add_argument("--instruct", default=None, help="voice or style instruction (voice_design, 1.7B custom_voice)")
    parser.add_argument("--ref-audio", type=Path, default=None,
                        help="base models: the voice to clone, an audio file of 1-30 s (WAV, FLAC, OGG, MP3)")
    parser.add_argument("--ref-text", default=None, help="the transcript of --ref-audio (in-context cloning)")
    parser.add_argument("--x-vector-only", action="store_true",
                        help="clone from the speaker embedding alone (no --ref-text needed)")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--greedy", action="store_true", help="argmax decoding (keeps the repetition penalty)")
    choice.add_argument("--seed", type=int, default=None, help="sampling seed (default: a random one, printed)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="most frames to make (default: generation_config)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="make exactly --max-new-tokens frames, never stopping at EOS (fixed-length runs)")
    parser.add_argument("--text-mode", choices=TEXT_MODES, default="non-streaming", help="how the text enters the talker")
    parser.add_argument("--output", type=Path, required=True, help="WAV file to write")
    parser.add_argument("--codes-out", type=Path, default=None, help="also save the codes, int64 (frames, 16), as .npy")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weights dtype (default float32)")


def _voice(model, tokenizer, args: argparse.Namespace):
    """The cloned voice of --ref-audio (what a decode replica computes for a request's ref_audio)."""
    import soundfile

    from services.model.voice.cloner import VoiceCloner
    from services.model.voice.errors import ReferenceAudioError

    try:
        samples, rate = soundfile.read(str(args.ref_audio), dtype="float32", always_2d=True)
    except (soundfile.SoundFileError, RuntimeError) as error:
        raise ReferenceAudioError("invalid_ref_audio", f"{args.ref_audio}: not readable audio: {error}") from error
    return VoiceCloner.load(model, tokenizer).make_prompt(samples, rate, args.ref_text, args.x_vector_only)


def run(args: argparse.Namespace) -> int:
    from services.model.codec.errors import CodecCheckpointError
    from services.model.errors import ModelError
    from services.model.sampling import SamplingParamsError
    from services.model.text_tokenizer import TokenizerError

    try:
        return _synthesize(args)
    except (ModelError, TokenizerError, CodecCheckpointError, SamplingParamsError) as error:
        code = getattr(error, "code", "error")
        print(f"voxmesh synth: {error} [{code}]", file=sys.stderr)
        return 1


def _synthesize(args: argparse.Namespace) -> int:
    from messages.frames import AudioChunk
    from services.gateway.http.wav import wav_bytes
    from services.model.codec.loader import load_codec_decoder
    from services.model.errors import RequestError
    from services.model.generate import default_sampling, generate
    from services.model.loader import load_model
    from services.model.prompt import check_can_generate, make_request
    from services.model.text_tokenizer import TextTokenizer

    started = time.perf_counter()
    model = load_model(args.model, dtype=DTYPES[args.dtype], device=args.device)
    check_can_generate(model.config, has_voice=args.ref_audio is not None)
    tokenizer = TextTokenizer.from_dir(args.model)
    request = make_request(
        tokenizer, args.text, instruct=args.instruct, speaker=args.speaker, language=args.language,
        non_streaming=args.text_mode == "non-streaming",
    )
    if args.ref_audio is not None:
        request = dataclasses.replace(request, voice=_voice(model, tokenizer, args))
    max_frames = model.generation.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens
    if max_frames <= 0:
        raise RequestError("bad_max_new_tokens", f"--max-new-tokens must be positive, got {max_frames}")
    seed = secrets.randbits(63) if args.seed is None and not args.greedy else (args.seed or 0)
    codes = generate(model, request, max_frames, *default_sampling(model.generation, args.greedy), seed=seed,
                     ignore_eos=args.ignore_eos)
    codec = load_codec_decoder(args.model / "speech_tokenizer", device=args.device, dtype=DTYPES[args.dtype])
    samples = _voiced(codec, codes, request.voice).float().cpu().numpy()
    # The vocoder service's float -> s16 conversion, so offline and mesh audio agree sample for sample.
    pcm = AudioChunk.from_float(request_id="synth", seq=0, first_sample=0, sample_rate=codec.sample_rate, samples=samples).pcm
    args.output.write_bytes(wav_bytes(pcm, codec.sample_rate))
    if args.codes_out is not None:
        np.save(args.codes_out, codes.numpy().astype(np.int64))
    mode = "greedy" if args.greedy else f"seed {seed}"
    seconds = len(samples) / codec.sample_rate
    print(f"{codes.shape[0]} frames, {seconds:.2f} s of audio ({mode}) in {time.perf_counter() - started:.2f} s -> {args.output}")
    return 0


def _voiced(codec: CodecDecoder, codes: torch.Tensor, voice: VoicePrompt | None) -> torch.Tensor:
    """The audio of `codes`. An in-context clone's codes continue its reference frames: they are decoded behind
    them and the reference's part cut off (as the vocoder primes its codec state, and as the reference does)."""
    if voice is None or voice.ref_codes is None:
        return codec.decode(codes.to(codec.device))
    context = voice.ref_codes.to(device=codec.device, dtype=codes.dtype)
    audio = codec.decode(torch.cat([context, codes.to(codec.device)]))
    return audio[context.shape[0] * codec.samples_per_frame:]
