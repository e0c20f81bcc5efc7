"""Integer helpers for the kernels' launchers, on the host.

Triton's own (`triton.cdiv`, `triton.next_power_of_2`) are JIT functions in Triton 3: each host call unwraps
its arguments as constexprs, a few microseconds, and a chunk-scan call made fourteen of them (half its Python
time on the development CPU, with the launches left out). A short prefill's time is the host's.
"""


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()
