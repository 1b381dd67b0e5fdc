"""voxmesh prefill: runs long prompts' prefill on its own GPU and hands the prompt KV to a decode replica by UCX."""
