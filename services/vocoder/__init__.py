"""voxmesh vocoder."""
