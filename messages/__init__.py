"""The bus contract: every subject, stream, consumer, bucket and message type of voxmesh."""
