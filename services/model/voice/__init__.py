"""Voice cloning with base checkpoints: reference audio to a ready voice prompt (speaker x-vector, reference codes)."""
