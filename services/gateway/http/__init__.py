"""The gateway's HTTP face: the routes, the speech response and its audio formats, request ids, readiness."""
