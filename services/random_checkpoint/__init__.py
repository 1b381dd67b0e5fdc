"""Checkpoints with deterministic random weights in the released Qwen3-TTS layout (`voxmesh model init`, test fixtures).

Nothing here is needed to load or serve a model (that is `services.model`): these modules only write one.
`checkpoint_writer.write_checkpoint` is the entry point; it writes config.json from `model_presets`, the talker
weights planned by `tensor_plan` through `safetensors_writer`, the tokenizer (`tokenizer_writer`), and
speech_tokenizer/ (`codec_writer`, with `codec_presets`, `codec_weights` and `codec_encoder_layout`).
"""
