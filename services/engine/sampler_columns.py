"""The columns of the frame sampler's static inputs (`predictor_graphs.PaddedFrameSampler`), which a running
request's own values (`slot_params.SlotParams`) fill as they are, so a step gathers them in one copy."""

NUM_FRAMES, FRAME, KEYS, MIN_FRAMES, TALKER_TOP_K, PREDICTOR_TOP_K, SEED = 0, 1, 2, 4, 5, 6, 7
"""Columns of the static int64 inputs (KEYS takes two columns: the keyed sampler's two hash lanes). The columns
from MIN_FRAMES on are a request's own, in the order of `SlotParams.ints`, so a step gathers them in one copy."""
PER_REQUEST_INTS = slice(MIN_FRAMES, SEED + 1)
PENALTY, TALKER_TEMPERATURE, TALKER_TOP_P, PREDICTOR_TEMPERATURE, PREDICTOR_TOP_P = 0, 1, 2, 3, 4
"""Columns of the static float32 inputs: all a request's own, in the order of `SlotParams.floats`."""
