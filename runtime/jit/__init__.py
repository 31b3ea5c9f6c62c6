"""What every room that compiles with numba shares: the float32 exp its kernels and the sampled pick compute alike
(exp32.py), and the kernel layouts compiled once (one_layout.py). The process-wide compile target, imported before
any compile, is common/numba_target.py (the PTX executor's numba loops build for it too)."""
