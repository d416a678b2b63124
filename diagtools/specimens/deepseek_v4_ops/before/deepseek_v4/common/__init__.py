"""Code every DeepSeek-V4 backend shares."""
