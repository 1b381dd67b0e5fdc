"""The Qwen3-TTS-12Hz codec decoder (code2wav) in plain torch: full and exact streaming decode.

    decoder = load_codec_decoder(checkpoint / "speech_tokenizer", device="cuda", dtype=torch.bfloat16)
    audio = decoder.decode(codes)                      # codes: LongTensor[T, 16] -> Tensor[T * 1920]
    state = decoder.new_stream()                       # per request, constant size
    chunk = decoder.decode_chunk(state, codes[:4])     # exact: chunks concatenate to decode(codes)
"""

from services.model.codec.config import CodecConfig
from services.model.codec.decoder import CodecDecoder
from services.model.codec.errors import CodecCheckpointError, CodecConfigError, CodecError, CodecInputError
from services.model.codec.loader import load_codec_decoder
from services.model.codec.stream_state import CodecStreamState

__all__ = [
    "CodecCheckpointError",
    "CodecConfig",
    "CodecConfigError",
    "CodecDecoder",
    "CodecError",
    "CodecInputError",
    "CodecStreamState",
    "load_codec_decoder",
]
