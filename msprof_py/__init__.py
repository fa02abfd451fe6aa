"""msprof-py: profiling and trace analysis for AI-accelerator runtimes."""

__version__ = "0.1.0"
