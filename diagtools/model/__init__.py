"""The domain: frozen dataclasses with JSON in and out, nothing else."""
