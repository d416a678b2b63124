"""A serving engine: the user's own package (the one a developer can edit)."""
