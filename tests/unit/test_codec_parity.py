"""The codec decoder against the reference: tiny random decoders built and saved with the
reference's own classes, loaded into voxmesh, decoded by both."""

from __future__ import annotations

import pytest
import torch

from services.model.codec import CodecConfig, load_codec_decoder
from tests.support.codec_reference import WINDOWED_DECODER, build_reference_tokenizer, random_codes

TOLERANCE = 1e-5

# The released proportions, shrunk: hidden narrower than heads x head_dim (as released),
# one kv head per query head, the released window of 72 frames.
RELEASED_PROPORTIONS = {
    "codebook_size": 128, "codebook_dim": 24, "latent_dim": 32, "hidden_size": 16,
    "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8, "intermediate_size": 32,
    "num_hidden_layers": 2, "sliding_window": 72, "decoder_dim": 48, "num_quantizers": 16,
    "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
}
DECODERS = {"windowed": (WINDOWED_DECODER, 0), "released_proportions": (RELEASED_PROPORTIONS, 1)}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module", params=sorted(DECODERS))
def reference_checkpoint(request, tmp_path_factory):
    """(reference model, saved directory, decoder config dict)."""
    torch.set_num_threads(1)
    decoder_config, seed = DECODERS[request.param]
    directory = tmp_path_factory.mktemp(f"codec_{request.param}")
    reference = build_reference_tokenizer(directory, decoder_config, seed=seed)
    return reference, directory, decoder_config


def _reference_audio(reference, codes: torch.Tensor) -> torch.Tensor:
    """The reference's public decode path (one forward pass for up to 300 frames)."""
    with torch.no_grad():
        return reference.decode(codes[None]).audio_values[0]


def test_config_reads_what_the_reference_builds(reference_checkpoint):
    reference, directory, _ = reference_checkpoint
    config = CodecConfig.from_dir(directory)
    built = reference.decoder.config
    assert config.num_quantizers == built.num_quantizers
    assert config.head_dim == reference.decoder.pre_transformer.layers[0].self_attn.head_dim
    assert config.sliding_window == built.sliding_window
    assert config.samples_per_frame == reference.decoder.total_upsample == 1920
    assert config.sample_rate == reference.get_output_sample_rate() == 24000


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_frames", [1, 13, 40])
def test_full_decode_matches_reference_float32(reference_checkpoint, device, num_frames):
    reference, directory, decoder_config = reference_checkpoint
    decoder = load_codec_decoder(directory, device=device, dtype=torch.float32)
    codes = random_codes(num_frames, 16, decoder_config["codebook_size"], seed=num_frames)

    expected = _reference_audio(reference, codes)
    audio = decoder.decode(codes)

    assert audio.shape == (num_frames * 1920,) and audio.dtype == torch.float32
    assert audio.device.type == device
    assert float(expected.std()) > 1e-3, "the reference decoder must produce a non-trivial signal"
    assert float((audio.cpu() - expected).abs().max()) <= TOLERANCE


def test_decode_follows_every_codebook(reference_checkpoint):
    """Changing one code of one codebook changes the audio: no codebook is ignored."""
    _, directory, decoder_config = reference_checkpoint
    decoder = load_codec_decoder(directory)
    codes = random_codes(6, 16, decoder_config["codebook_size"], seed=7)
    base = decoder.decode(codes)
    for codebook in (0, 1, 15):
        changed = codes.clone()
        changed[3, codebook] = (changed[3, codebook] + 1) % decoder_config["codebook_size"]
        assert float((decoder.decode(changed) - base).abs().max()) > 1e-4


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_decode_tracks_float32(reference_checkpoint, device):
    _, directory, decoder_config = reference_checkpoint
    codes = random_codes(12, 16, decoder_config["codebook_size"], seed=3)
    exact = load_codec_decoder(directory, device=device, dtype=torch.float32).decode(codes)
    decoder = load_codec_decoder(directory, device=device, dtype=torch.bfloat16)

    audio = decoder.decode(codes)
    state = decoder.new_stream()
    streamed = torch.cat([decoder.decode_chunk(state, codes[i : i + 5]) for i in range(0, 12, 5)])

    assert decoder.dtype == torch.bfloat16 and audio.dtype == torch.float32
    assert all(t.dtype == torch.bfloat16 for t in state.tensors())
    error = float((audio - exact).pow(2).mean().sqrt())
    assert error < 0.1 * float(exact.std()), "bfloat16 must track float32 to a few percent"
    assert float((streamed - audio).pow(2).mean().sqrt()) < 0.1 * float(exact.std())
