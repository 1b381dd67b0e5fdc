"""voxmesh decode."""
