"""NVIDIA-specific parts of the model."""
