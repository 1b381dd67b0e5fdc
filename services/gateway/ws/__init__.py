"""The gateway's WebSocket face: the streaming protocol, one session per socket (its jobs and text
segmentation are in gateway/requests/, which HTTP's long input shares), and resume."""
