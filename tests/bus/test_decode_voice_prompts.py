"""Decode's voice prompts (real nats-server object stores, the tiny base checkpoint's real encoders): computed from
stored reference audio exactly as the cloner computes them, once per reference (cached; concurrent requests share
one computation), saved voices round-trip through VOICES, and what is missing or bad fails with a code."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
import torch

from messages import decode, encode
from messages.errors import ErrorCode
from messages.requests import SynthesisRequest
from messages.streams import BusConfig
from messages.voice_clone import (REF_AUDIO_STORE, VOICES_STORE, ReferenceAudio, SavedVoice, VoiceClone,
                                  VoiceCreate, saved_voice_key)
from services.bus.object_store import delete_object, open_object_store, read_object, write_object
from services.decode.request_check import Admission, RequestRefused, ServedModel, admit
from services.decode.settings import DecodeSettings
from services.decode.voice_prompts import VoicePrompts
from services.decode.voice_work import ThreadPromptMaker
from services.model.config import load_config
from services.model.loader import load_model
from services.model.prompt import PromptRequest
from services.model.sampling import SamplingParams
from services.model.text_tokenizer import TextTokenizer
from services.model.voice.cloner import VoiceCloner
from tests.support.nats_server import fresh_bus
from tests.support.reference_audio_files import tone

pytestmark = pytest.mark.timeout(120)

REF_TEXT = "This is how I sound."


@pytest.fixture(scope="module")
def cloner(tiny_base_checkpoint: Path) -> VoiceCloner:
    return VoiceCloner.load(load_model(tiny_base_checkpoint), TextTokenizer.from_dir(tiny_base_checkpoint))


@pytest.fixture
async def voices(nats_client, cloner):
    js = nats_client.jetstream()
    await fresh_bus(js, BusConfig(storage="memory"))
    prompts = VoicePrompts(js, ThreadPromptMaker(cloner), "tiny")
    try:
        yield prompts
    finally:
        prompts.close()


async def _store_reference(js, key: str, seconds: float = 2.0, rate: int = 24000) -> torch.Tensor:
    samples = tone(seconds, rate)[:, 0]
    audio = ReferenceAudio(sample_rate=rate, samples=samples.astype("<f4").tobytes())
    await write_object(await open_object_store(js, REF_AUDIO_STORE), key, encode(audio))
    return torch.from_numpy(samples)


def _admission(clone: VoiceClone) -> Admission:
    request = SynthesisRequest(id="req-1", model="tiny", text="Hello.", clone=clone)
    params = SamplingParams(temperature=0.0)
    return Admission(request, PromptRequest(text_ids=(1, 2, 3)), params, params, 10, 1)


async def test_a_reference_is_computed_once_beside_the_loop_and_attached(voices, cloner):
    samples = await _store_reference(voices.js, "ref-a", rate=16000)
    clone = VoiceClone(audio_key="ref-a", ref_text=REF_TEXT)
    attached = await asyncio.gather(*(voices.attach(_admission(clone)) for _ in range(3)))
    again = await voices.attach(_admission(clone))
    expected = cloner.make_prompt(samples, 16000, REF_TEXT, x_vector_only=False)
    for admission in (*attached, again):
        voice = admission.prompt.voice
        torch.testing.assert_close(voice.speaker_embedding, expected.speaker_embedding)
        assert torch.equal(voice.ref_codes, expected.ref_codes) and voice.ref_text_ids == expected.ref_text_ids
        assert admission.prompt.text_ids == (1, 2, 3)
    assert voices.num_computed == 1, "concurrent and later requests for one reference share one computation"
    x_vector = await voices.attach(_admission(VoiceClone(audio_key="ref-a", x_vector_only=True)))
    assert x_vector.prompt.voice.ref_codes is None and voices.num_computed == 2  # another mode, another prompt


async def test_saved_voices_round_trip_and_skip_the_audio_work(voices):
    await _store_reference(voices.js, "ref-b")
    created = await voices.create(VoiceCreate(name="narrator", model="tiny", audio_key="ref-b", ref_text=REF_TEXT))
    assert created.error is None and created.num_ref_frames == 25  # ceil(48000 / 1920)
    store = await open_object_store(voices.js, VOICES_STORE)
    info, data = await read_object(store, saved_voice_key("tiny", "narrator"))
    record = decode(data, SavedVoice)
    assert (record.name, record.ref_text, record.x_vector_only, record.duration_s) == ("narrator", REF_TEXT, False,
                                                                                      2.0)
    computed = voices.num_computed
    direct = await voices.prompt_for(VoiceClone(audio_key="ref-b", ref_text=REF_TEXT))
    saved = await voices.prompt_for(VoiceClone(voice="narrator", voice_revision=info.revision))
    assert voices.num_computed == computed + 1  # the direct one; the saved one was read, not computed
    torch.testing.assert_close(saved.speaker_embedding, direct.speaker_embedding)
    assert torch.equal(saved.ref_codes, direct.ref_codes) and saved.ref_text_ids == direct.ref_text_ids
    await delete_object(store, saved_voice_key("tiny", "narrator"))
    with pytest.raises(RequestRefused) as gone:
        await voices.prompt_for(VoiceClone(voice="narrator", voice_revision="another-revision"))
    assert gone.value.code == ErrorCode.UNKNOWN_VOICE


@pytest.mark.parametrize("clone,seconds,code", [
    (VoiceClone(audio_key="ref-missing", ref_text=REF_TEXT), None, ErrorCode.INVALID_REF_AUDIO),
    (VoiceClone(audio_key="ref-short", ref_text=REF_TEXT), 0.4, ErrorCode.REF_AUDIO_TOO_SHORT),
    (VoiceClone(audio_key="ref-nontext"), 2.0, ErrorCode.REF_TEXT_REQUIRED),
    (VoiceClone(voice="never-saved"), None, ErrorCode.UNKNOWN_VOICE),
])
async def test_what_cannot_make_a_prompt_fails_with_a_code(voices, clone, seconds, code):
    if seconds is not None:
        await _store_reference(voices.js, clone.audio_key, seconds)
    with pytest.raises(RequestRefused) as refused:
        await voices.attach(_admission(clone))
    assert refused.value.code == code
    created = await voices.create(VoiceCreate(name="v", model="tiny", audio_key=clone.audio_key or "ref-none",
                                              ref_text=clone.ref_text))
    assert created.error is not None and created.revision is None


async def test_a_voice_for_another_model_is_refused(voices):
    await _store_reference(voices.js, "ref-c")
    created = await voices.create(VoiceCreate(name="v", model="other", audio_key="ref-c", x_vector_only=True))
    assert created.error.code == ErrorCode.UNKNOWN_MODEL


def test_admission_needs_a_voice_on_base_models_and_refuses_one_elsewhere(tiny_base_checkpoint, tiny_checkpoint):
    def served(directory: Path) -> ServedModel:
        return ServedModel("tiny", *load_config(directory), TextTokenizer.from_dir(directory))

    settings = DecodeSettings()
    plain = SynthesisRequest(id="req-1", model="tiny", text="Hello.")
    cloned = replace_request(plain, clone=VoiceClone(audio_key="ref-a", x_vector_only=True))
    assert admit(cloned, served(tiny_base_checkpoint), settings).prompt.voice is None  # attached later
    for request, directory, code in ((plain, tiny_base_checkpoint, ErrorCode.VOICE_REQUIRED),
                                     (cloned, tiny_checkpoint, ErrorCode.VOICE_CLONING_UNSUPPORTED)):
        with pytest.raises(RequestRefused) as refused:
            admit(request, served(directory), settings)
        assert refused.value.code == code


def replace_request(request: SynthesisRequest, **changes) -> SynthesisRequest:
    return msgspec.structs.replace(request, **changes)


@pytest.mark.parametrize("x_vector_only", [False, True], ids=["in-context", "x-vector"])
async def test_a_prompt_handed_over_by_prefill_is_attached_without_the_audio_work(voices, cloner, x_vector_only):
    """A prefill replica computes the prompt and hands it over in its `PrefillHandoff` (`ReadyVoice`, through the
    bus's encoding); decode keeps it (`prime`) and attaches exactly that prompt, computing nothing."""
    from messages.mtp import PrefillHandoff
    from services.decode.voice_records import ready_prompt, ready_voice

    samples = tone(2.0, 24000)[:, 0]
    made = cloner.make_prompt(samples, 24000, None if x_vector_only else REF_TEXT, x_vector_only=x_vector_only)
    clone = VoiceClone(audio_key="never-stored", ref_text=None if x_vector_only else REF_TEXT,
                       x_vector_only=x_vector_only)
    request = SynthesisRequest(id="req-1", model="tiny", text="Hello.", clone=clone)
    handoff = PrefillHandoff(request=request, fingerprint="f", prefill_replica="prefill-a", prompt_tokens=3,
                             transfer=b"t", first_frame=[0] * 16, voice=ready_voice(made))
    received = decode(encode(handoff), PrefillHandoff)
    voices.prime(received.request.clone, ready_prompt(received.voice))
    attached = (await voices.attach(_admission(clone))).prompt.voice
    assert voices.num_computed == 0, "the reference audio is not even stored: it was not read"
    assert torch.equal(attached.speaker_embedding, made.speaker_embedding.float())
    assert attached.ref_text_ids == made.ref_text_ids
    assert (attached.ref_codes is None) if x_vector_only else torch.equal(attached.ref_codes, made.ref_codes)


@pytest.mark.parametrize("fields", [{"speaker_embedding": b"\x00" * 5},
                                    {"speaker_embedding": b"\x00" * 8, "ref_codes": b"\x00" * 33, "ref_text_ids": [1]},
                                    {"speaker_embedding": b"\x00" * 8, "ref_codes": b"\x00" * 32}],
                         ids=["embedding-bytes", "codes-bytes", "codes-without-transcript"])
def test_a_malformed_handed_over_prompt_is_refused_with_its_reason(fields):
    """What `_take_voice` catches (decode then computes the prompt itself), never another exception."""
    from messages.voice_clone import ReadyVoice
    from services.decode.voice_records import ready_prompt
    from services.model.voice.errors import ReferenceAudioError

    with pytest.raises(ReferenceAudioError) as refused:
        ready_prompt(ReadyVoice(**fields))
    assert refused.value.code == "invalid_voice_prompt"
