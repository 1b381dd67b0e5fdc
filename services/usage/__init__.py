"""Usage per tenant and model: one record per ended request (recorder.py), read back as totals (totals.py)."""
