"""The gateway's WebSocket face: the streaming protocol, one session per socket, its jobs, text segmentation
and resume."""
