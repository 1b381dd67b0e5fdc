"""The codec's Triton kernels: SnakeBeta, bias and residual adds, the dilated convolution, the slot pool's history
stores, and the layouts and tiles they read."""
