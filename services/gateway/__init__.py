"""voxmesh gateway."""
