"""What every layer may import: the typed errors (kernels, runtime and builder alike)."""
