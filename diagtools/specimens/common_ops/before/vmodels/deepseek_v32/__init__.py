"""A model that uses the common ops."""
