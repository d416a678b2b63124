"""The JIT compiler's settings."""
