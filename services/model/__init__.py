"""voxmesh model."""
