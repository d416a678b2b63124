"""A reduced model library with the import structure of vllm.models."""
