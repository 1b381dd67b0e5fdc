"""`voxmesh up`'s local mesh: a topology's compose file read into a launch plan, and the child processes it starts."""
