"""`GET /v1/models`, `GET /v1/models/{model}` (OpenAI's model objects, plus the checkpoint's fingerprint) and
`GET /v1/audio/voices` (the speakers and languages a request may name)."""

from __future__ import annotations

from fastapi import APIRouter

from messages.audio_format import SAMPLE_RATE
from messages.errors import ErrorCode
from services.gateway.deps import Authorized, GatewayDep
from services.gateway.errors import GatewayError
from services.gateway.http.openapi import error_responses
from services.gateway.http.routes.saved_voices import voice_object
from services.gateway.requests.catalog import VoiceCatalog
from services.gateway.requests.response_formats import FORMATS, available_formats

router = APIRouter()


def model_object(catalog: VoiceCatalog) -> dict:
    """OpenAI's model object (`id`, `object`, `created`, `owned_by`) with voxmesh's facts about the checkpoint and
    the answers it is served in (`sample_rate`: the model's own; `sample_rates`: each response format's)."""
    return {"id": catalog.model, "object": "model", "created": catalog.created, "owned_by": "voxmesh",
            "fingerprint": catalog.fingerprint, "model_type": catalog.model_type, "sample_rate": SAMPLE_RATE,
            "voices": list(catalog.speakers), "languages": list(catalog.languages),
            "response_formats": list(available_formats()),
            "sample_rates": {name: list(FORMATS[name].rates) for name in available_formats()}}


@router.get("/v1/models", responses=error_responses(401))
async def list_models(gateway: GatewayDep, _: Authorized) -> dict:
    """The model this gateway serves (one per gateway)."""
    return {"object": "list", "data": [model_object(gateway.catalog)]}


@router.get("/v1/models/{model}", responses=error_responses(401, 404))
async def retrieve_model(model: str, gateway: GatewayDep, _: Authorized) -> dict:
    """The served model by name; 404 `unknown_model` for any other."""
    if not gateway.catalog.serves(model):
        raise GatewayError(ErrorCode.UNKNOWN_MODEL, f"unknown model {model!r}; this gateway serves "
                           f"{gateway.catalog.model!r}", param="model", status=404)
    return model_object(gateway.catalog)


@router.get("/v1/audio/voices", responses=error_responses(401))
async def list_voices(gateway: GatewayDep, _: Authorized) -> dict:
    """The voices (speakers) and languages of the served model, and `default`: the voice of a request that names
    none (the first speaker). A model without named voices (voice_design) lists none and has no default: describe
    the voice in `instructions`. A base model lists its saved voices (`"saved": true`)."""
    catalog = gateway.catalog
    voices = [{"id": name, "name": name} for name in catalog.speakers]
    if catalog.model_type == "base" and gateway.synthesizer.voices is not None:  # its saved voices (routes/saved_voices.py)
        voices += [voice_object(v.name, v.revision, v.modified, v.description)
                   for v in await gateway.synthesizer.voices.saved_voices()]
    return {"object": "list", "model": catalog.model, "default": catalog.default_voice,
            "voices": voices, "languages": list(catalog.languages)}
