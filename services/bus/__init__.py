"""voxmesh bus."""
