"""The code-predictor (mtp) service: stateless replicas that compute codebooks 1..15 of a step's rows, and the
decode-side client that sends each step to the least-loaded live replica."""
