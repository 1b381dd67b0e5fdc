"""One-off probes and sweeps kept for reference (experiments/README.md): not installed, never imported by the product."""
