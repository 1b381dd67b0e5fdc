"""What the served checkpoint offers a client: its name, speakers (voices) and languages.

Read from the checkpoint's config.json (no weights are loaded), so the gateway validates voice and language before
a request costs the mesh anything; the fingerprint samples the weight files' bytes once, at startup.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from messages import subjects
from messages.errors import ErrorCode
from services.model.checkpoint_summary import CheckpointInfoError, checkpoint_fingerprint
from services.model.config import TTSConfig, parse_config, read_json
from services.model.errors import ModelError


class CatalogError(ValueError):
    """The gateway cannot describe its model (no model dir, or an unreadable config.json); raised at startup."""

    code = ErrorCode.INVALID_CONFIG


@dataclass(frozen=True, slots=True)
class VoiceCatalog:
    """The served model as clients see it.

    Attributes:
        model: the model name clients ask for (settings.model_name).
        model_type: the checkpoint's tts_model_type (custom_voice, voice_design, base).
        speakers: lower-cased speaker names (custom_voice checkpoints), in checkpoint order.
        languages: "auto" and every language a request may name, lower-cased.
        fingerprint: the checkpoint's fingerprint (`checkpoint_fingerprint`), None when the directory holds no
            weights (a gateway may be given config files only).
        created: unix time of config.json (OpenAI's `created` of a model).
    """

    model: str
    model_type: str
    speakers: tuple[str, ...]
    languages: tuple[str, ...]
    fingerprint: str | None = None
    created: int = 0

    @classmethod
    def from_dir(cls, model_dir: str | Path | None, model: str) -> VoiceCatalog:
        """Read `model_dir/config.json` (weights are not touched)."""
        if model_dir is None:
            raise CatalogError("the gateway needs --model-dir (VOXMESH_MODEL_DIR): it validates voices and "
                               "languages against the checkpoint's config.json")
        try:
            config = _read_config(Path(model_dir))
        except ModelError as exc:
            raise CatalogError(f"cannot read the served model's config: {exc}") from exc
        catalog = cls.from_config(config, model)
        return dataclasses.replace(catalog, fingerprint=_fingerprint(Path(model_dir)),
                                   created=int((Path(model_dir) / "config.json").stat().st_mtime))

    @classmethod
    def from_config(cls, config: TTSConfig, model: str) -> VoiceCatalog:
        subjects.slug(model)  # a name that cannot be a subject token fails here, at startup
        return cls(model=model, model_type=config.tts_model_type,
                   speakers=tuple(name.lower() for name in config.talker.speaker_ids),
                   languages=tuple(name.lower() for name in config.languages))

    @property
    def default_voice(self) -> str | None:
        """The voice of a request that names none: the checkpoint's first speaker (None for a model without named
        voices, which describes the voice in `instructions`)."""
        return self.speakers[0] if self.speakers else None

    def serves(self, model: str) -> bool:
        """Whether a client's `model` names this model (exactly, or the same after slugging)."""
        return subjects.same_model(model, self.model)


def _fingerprint(model_dir: Path) -> str | None:
    try:
        return checkpoint_fingerprint(model_dir)
    except (CheckpointInfoError, OSError):  # config files only: the gateway needs no weights to serve
        return None


def _read_config(model_dir: Path) -> TTSConfig:
    """config.json only: the gateway needs the speakers and languages, not the sampling defaults or weights."""
    path = model_dir / "config.json"
    return parse_config(read_json(path), path)
