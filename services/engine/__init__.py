"""voxmesh engine."""
