"""amplint: find and fix automatic-mixed-precision mistakes in PyTorch code."""

__version__ = "0.1.0"
