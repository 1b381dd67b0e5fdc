"""The gateway's endpoints, one router per feature."""
