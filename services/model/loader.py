"""Loading a checkpoint directory into the talker and the code predictor (and, for base checkpoints, the
speaker encoder's weights).

Modules are built on the meta device, so building costs nothing; their expected names and shapes are
checked against the safetensors headers before a byte of weights is read; tensors used by both modules
(the talker's codec embedding, the 15 code-predictor embedding tables) are loaded once and shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from services.kernels.triton_support import compiles_for
from services.model import checkpoint, sampling_check, small_attention
from services.model.code_predictor import CodePredictor
from services.model.config import GenerationDefaults, TalkerConfig, TTSConfig, load_config
from services.model.kernel_choices import KernelChoices
from services.model.kernel_verdicts import KernelVerdicts
from services.model.layers import fuse_projections
from services.model.talker import Talker
from services.model.unset_weights import unset_weights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class TTSModel:
    directory: Path
    config: TTSConfig
    generation: GenerationDefaults
    talker: Talker
    code_predictor: CodePredictor
    speaker_encoder: dict[str, torch.Tensor] | None
    """Base checkpoints only: the speaker encoder's weights by checkpoint name, parsed and shape-checked."""
    kernels: KernelVerdicts = KernelVerdicts()
    """What the start-up checks of the fused kernels decided on this device (`check_fused_kernels`)."""

    @property
    def device(self) -> torch.device:
        return self.talker.codec_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.talker.codec_head.weight.dtype


def checkpoint_names(module: nn.Module, prefixes: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """Module parameter name -> checkpoint tensor name, by the module's (module prefix, checkpoint prefix) table."""
    names = {}
    for name in module.state_dict():
        match = max((p for p in prefixes if name.startswith(p[0])), key=lambda p: len(p[0]))
        names[name] = match[1] + name[len(match[0]) :]
    return names


def _fill(module: nn.Module, names: dict[str, str], tensors: dict[str, torch.Tensor]) -> None:
    module.load_state_dict({name: tensors[ckpt] for name, ckpt in names.items()}, strict=True, assign=True)


def load_model(directory: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               choices: KernelChoices = KernelChoices()) -> TTSModel:
    """Load and validate a checkpoint directory, its layers taking the kernels `choices` allow; raises
    `CheckpointError` naming the file and tensor at fault."""
    directory = Path(directory)
    device = torch.device(device)
    config, generation = load_config(directory)
    with torch.device("meta"), unset_weights():
        talker, predictor = Talker(config.talker), CodePredictor(config.talker)
    talker_names = checkpoint_names(talker, Talker.CHECKPOINT_PREFIXES)
    predictor_names = checkpoint_names(predictor, CodePredictor.CHECKPOINT_PREFIXES)
    expected = {}
    for module, names in ((talker, talker_names), (predictor, predictor_names)):
        state = module.state_dict()
        expected.update({ckpt: tuple(state[name].shape) for name, ckpt in names.items()})
    if config.speaker_encoder is not None:
        expected.update(checkpoint.speaker_encoder_shapes(config.speaker_encoder))
    stored = checkpoint.scan(directory)
    checkpoint.check(stored, expected, directory)
    tensors = checkpoint.load_tensors(stored, list(expected), dtype, device)
    _fill(talker, talker_names, tensors)
    _fill(predictor, predictor_names, tensors)
    encoder = {n: t for n, t in tensors.items() if n.startswith("speaker_encoder.")} if config.speaker_encoder else None
    return assemble(directory, config, generation, talker, predictor, encoder, choices)


def assemble(directory: Path, config: TTSConfig, generation: GenerationDefaults, talker: Talker,
             predictor: CodePredictor, speaker_encoder: dict[str, torch.Tensor] | None,
             choices: KernelChoices = KernelChoices()) -> TTSModel:
    """The model as it serves, from a talker and a code predictor whose weights are in place on their device: the
    one place where the kernels are wired (`load_model` comes through here, and so do the device harness's
    random-weight models, so that a benchmark times what a service serves). On a device Triton compiles for, the
    projections are fused as `choices` allow and the start-up checks decide the sampler and the code predictor's
    attention kernel; elsewhere the modules keep the reference's exact form and nothing is checked."""
    for module in (talker, predictor):
        module.requires_grad_(False)
        module.eval()
    device, dtype = talker.codec_head.weight.device, talker.codec_head.weight.dtype
    kernels = KernelVerdicts()
    if compiles_for(device):  # fewer launches where they cost the most; the CPU keeps the reference's exact form
        fuse_projections(talker, choices.gated_gemm)
        fuse_projections(predictor, choices.gated_gemm)
        kernels = check_fused_kernels(config.talker, device, dtype)
        predictor.fused_attention = kernels.small_attention
    return TTSModel(directory, config, generation, talker, predictor, speaker_encoder, kernels)


def check_fused_kernels(talker: TalkerConfig, device: torch.device, dtype: torch.dtype) -> KernelVerdicts:
    """Check once, on the device, the fused kernels that are not checked elsewhere at start-up (the code predictor's
    attention, the sampler): the verdicts, for the model to keep; one that fails there is not taken, and the torch
    form serves (logged)."""
    cfg = talker.code_predictor
    decoder = cfg.decoder
    return KernelVerdicts(
        whole_row_sampler=sampling_check.check(device, (talker.vocab_size, cfg.vocab_size)),
        small_attention=small_attention.check(device, dtype, decoder.num_heads, decoder.num_kv_heads,
                                              decoder.head_dim, cfg.num_code_groups))
