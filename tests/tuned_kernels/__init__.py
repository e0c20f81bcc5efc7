"""A tiny autotuned package for tests/test_autotune.py: a copy kernel whose tail mask is wrong under one config."""
