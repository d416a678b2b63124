"""Use cases: each starts processes through a seam, collects, and assembles a result."""
