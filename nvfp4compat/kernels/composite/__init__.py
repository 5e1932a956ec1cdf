"""Composite implementations: existing kernels chained into one operation (e.g. dequantize-then-attend)."""
