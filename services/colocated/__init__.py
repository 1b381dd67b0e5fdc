"""Decode and the vocoder in one process (`voxmesh serve colocated`): one CUDA context for talker and codec."""
