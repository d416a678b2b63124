"""The runner: starts a program in a fresh subkernel and brings back everything it recorded."""
