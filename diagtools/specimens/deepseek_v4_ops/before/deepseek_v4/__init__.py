"""DeepSeek-V4 model package (a reduced copy of the import structure only)."""
