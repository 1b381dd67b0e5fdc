"""voxmesh services: one package per actor, plus the shared machinery (model, engine, bus)."""
