"""Every Triton kernel of voxmesh, and its support module (`triton_support`): a leaf that imports torch, Triton and
itself only. The model keeps the torch forms and chooses a kernel in its layers; `codec/` holds the codec's."""
