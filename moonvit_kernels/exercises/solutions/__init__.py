"""The solutions of the exercises, one file each (`<notebook prefix>_<exercise>.py`, `.cu` for CUDA C).

They ship with the package so that `exercises.solution(name)` and `load_solution(name)` work from a wheel;
they are read as text (and a numba one executed in its own namespace), never imported as modules.
"""
