"""The artifact reader (``artifact``) and the CPU runtime over an artifact's CPU library (``runner``):
the layer above the compiler, below the server and the validator."""
