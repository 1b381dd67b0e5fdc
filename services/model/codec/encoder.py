"""The codec encoder: reference audio (24 kHz) -> codec frames of 16 codes, the frames the talker continues from
when it clones a voice in context.

SEANet convolutions (25 Hz hidden frames), a causal transformer, a strided convolution to 12.5 Hz, then the split
residual VQ; the output keeps `ceil(n / 1920)` frames, as many as the audio fills. Names mirror the checkpoint's
`encoder.*` tensors.
"""

from __future__ import annotations

import torch
from torch import nn

from services.model.codec.encoder_config import CodecEncoderConfig
from services.model.codec.encoder_convs import PaddedCausalConv, SeanetEncoder
from services.model.codec.encoder_quantizer import SplitQuantizer
from services.model.codec.encoder_transformer import EncoderTransformer


class CodecEncoder(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = SeanetEncoder(cfg)
        self.encoder_transformer = EncoderTransformer(cfg)
        stride = cfg.downsample_stride
        self.downsample = (PaddedCausalConv(cfg.hidden_size, cfg.hidden_size, 2 * stride, stride=stride, bias=False,
                                            pad_mode="replicate") if stride > 1 else None)
        self.quantizer = SplitQuantizer(cfg)

    @property
    def sample_rate(self) -> int:
        return self.cfg.sampling_rate

    def encode(self, samples: torch.Tensor) -> torch.Tensor:
        """Mono samples [n] at `sample_rate` -> codes [ceil(n / samples_per_frame), valid_num_quantizers] (int64)."""
        weight = self.encoder.layers[0].conv.weight
        x = samples.to(device=weight.device, dtype=weight.dtype)[None, None]
        hidden = self.encoder(x)
        hidden = self.encoder_transformer(hidden.transpose(1, 2)).transpose(1, 2)
        if self.downsample is not None:
            hidden = self.downsample(hidden)
        codes = self.quantizer.encode(hidden, self.cfg.valid_num_quantizers)[0]
        num_frames = -(-samples.shape[0] // self.cfg.samples_per_frame)
        return codes[:, :num_frames].T.contiguous()
