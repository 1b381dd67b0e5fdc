"""A request's way through the gateway, whichever face it came in by: validation, submission, its audio stream,
gap repair, supervision until its terminal event, and its outcome metrics."""
