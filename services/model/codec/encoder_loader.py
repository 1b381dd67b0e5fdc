"""Load the codec encoder from a checkpoint's `speech_tokenizer/`: its config's `encoder_config` and the `encoder.*`
tensors of `model.safetensors` (or its shards). Every mismatch is a `CodecCheckpointError` naming file and tensor.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from services.model.codec.encoder import CodecEncoder
from services.model.codec.encoder_config import CodecEncoderConfig
from services.model.codec.encoder_quantizer import fix_codebooks
from services.model.codec.errors import CodecCheckpointError
from services.model.codec.loader import weight_locations
from services.model.unset_weights import unset_weights

ENCODER_PREFIX = "encoder."


def load_codec_encoder(speech_tokenizer_dir: str | Path, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.float32) -> CodecEncoder:
    """A `CodecEncoder` on `device` in `dtype` (float32 by default: it runs once per reference, off the hot path)."""
    directory = Path(speech_tokenizer_dir)
    config = CodecEncoderConfig.from_dir(directory)
    with torch.device("meta"), unset_weights():
        model = CodecEncoder(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    locations = weight_locations(directory)
    by_file: dict[Path, list[str]] = {}
    for name in expected:
        key = ENCODER_PREFIX + name
        if key not in locations:
            raise CodecCheckpointError("missing_tensor", f"{directory}: tensor {key!r} is missing (the codec encoder "
                                       "voice cloning needs)")
        by_file.setdefault(locations[key], []).append(name)
    tensors: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt") as handle:
            for name in names:
                tensor = handle.get_tensor(ENCODER_PREFIX + name)
                if tuple(tensor.shape) != expected[name] or not tensor.dtype.is_floating_point:
                    raise CodecCheckpointError("tensor_shape_mismatch", f"{path}: tensor {ENCODER_PREFIX + name!r} "
                                               f"is {tensor.dtype} {tuple(tensor.shape)}, expected float {expected[name]}")
                tensors[name] = tensor.to(torch.float32)
    model.load_state_dict(tensors, strict=True, assign=True)
    model = model.to(device=device, dtype=dtype).requires_grad_(False).eval()
    fix_codebooks(model)  # the codebooks never change once loaded
    return model
