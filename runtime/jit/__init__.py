"""What every room that compiles with numba shares: the process-wide compile target (target.py, imported
before any compile) and the float32 exp its kernels and the sampled pick compute alike (exp32.py)."""
