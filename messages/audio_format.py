"""The audio the mesh carries: mono PCM, signed 16-bit little-endian, at 24 kHz, made 1920 samples (80 ms) per codec
frame of 16 codes, so 12.5 frames per second of audio.

The released Qwen3-TTS-12Hz codec fixes these numbers. A checkpoint states them again in its config (the model code
reads them there, not here), and every AudioChunk names its own sample rate; everything else uses these.
"""

from __future__ import annotations

SAMPLE_RATE = 24000
"""Samples per second of the audio the vocoder publishes."""

SAMPLES_PER_FRAME = 1920
"""Samples one codec frame decodes to."""

FRAMES_PER_SECOND = SAMPLE_RATE / SAMPLES_PER_FRAME
"""Codec frames per second of audio (12.5): what `max_new_tokens` and the frame counts count."""

CHANNELS = 1
"""Mono."""

BYTES_PER_SAMPLE = 2
"""s16le: two bytes a sample."""
