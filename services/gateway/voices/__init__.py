"""Voice cloning in the gateway: reference audio in, object-store keys out; saved voices."""
