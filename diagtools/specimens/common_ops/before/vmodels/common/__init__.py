"""Code shared by several models."""
