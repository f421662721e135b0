"""CUDA C exercises (placeholder while being written)."""

EXERCISES = ()
