"""A CPU op."""


def norm(x):
    return x
