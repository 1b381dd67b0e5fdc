"""peer_fields.resolved without a server: vLLM-Omni's task_type against each checkpoint kind, and a resolved body
carrying only voxmesh's own fields (resolving it again changes nothing)."""

from __future__ import annotations

import pytest

from services.gateway.errors import AdmissionError
from services.gateway.requests.body import SpeechBody, parse_body
from services.gateway.requests.catalog import VoiceCatalog
from services.gateway.requests.peer_fields import TASK_TYPE_OF_MODEL, resolved

KINDS = ("custom_voice", "voice_design", "base")


def catalog(model_type: str, speakers: tuple[str, ...] = ()) -> VoiceCatalog:
    return VoiceCatalog(model="tiny", model_type=model_type, speakers=speakers, languages=("auto", "english"))


@pytest.mark.parametrize("model_type", KINDS)
def test_task_type_is_accepted_only_for_the_kind_served(model_type):
    for task_type in ("CustomVoice", "VoiceDesign", "Base"):
        body = SpeechBody(input="Hi.", task_type=task_type)
        if TASK_TYPE_OF_MODEL[model_type] == task_type:
            assert resolved(body, catalog(model_type)).task_type is None
            continue
        with pytest.raises(AdmissionError) as refused:
            resolved(body, catalog(model_type))
        assert refused.value.code == "task_type_mismatch" and model_type in refused.value.message


def test_a_resolved_body_holds_voxmesh_fields_only_and_resolves_to_itself():
    raw = (b'{"input": "Hi.", "speaker": "Ryan", "stream": true, "non_streaming_mode": false, '
           b'"initial_codec_chunk_frames": 2, "sample_rate": 24000, "task_type": "Base"}')
    body = resolved(parse_body(raw, SpeechBody), catalog("base"))
    assert (body.voice, body.stream_format, body.text_mode, body.initial_chunk_frames) == ("Ryan", "audio",
                                                                                           "streaming", 2)
    assert (body.stream, body.non_streaming_mode, body.speaker, body.initial_codec_chunk_frames,
            body.task_type) == (None,) * 5
    assert body.sample_rate == 24000  # voxmesh's own field too: the answer's rate
    assert resolved(body, catalog("base")) == body


def test_voice_default_is_the_models_default_speaker_unless_a_voice_is_so_named():
    assert resolved(SpeechBody(input="Hi.", voice="Default"), catalog("custom_voice", ("ryan",))).voice is None
    assert resolved(SpeechBody(input="Hi.", voice="default"), catalog("custom_voice", ("default",))).voice == \
        "default"
    assert resolved(SpeechBody(input="Hi.", voice="default"), catalog("base")).voice == "default"  # a saved voice
