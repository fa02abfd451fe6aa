"""narrow_kernels.py tiled into one block per AI Core: the fix for its under-occupancy."""

from narrow_kernels import main

if __name__ == "__main__":
    main(20)
