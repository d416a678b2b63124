"""Renderers: results to text and HTML."""
