"""`python -m dashboard TRACE_OR_PROF_DIR [MORE ...] [--host H] [--port P]`: the same as `msprof-py dashboard`."""

from msprof_py.cli import app

if __name__ == "__main__":
    app(args=["dashboard", *__import__("sys").argv[1:]], prog_name="python -m dashboard")
