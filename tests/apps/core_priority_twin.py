"""core_starvation.py with priority preemption on: the decode kernels take the cores at the next
block boundary instead of after the whole background MatMul (the fix for its core contention)."""

from core_starvation import main

if __name__ == "__main__":
    main(preemption=True)
