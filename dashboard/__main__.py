"""`python -m dashboard TRACE_OR_PROF_DIR [MORE ...] [--host H] [--port P]`: the same as `msprof-py dashboard`."""

import sys

from msprof_py.cli import app

if __name__ == "__main__":
    # Through the CLI's command group, so errors get its one-line form and exit code 2; the
    # program name makes its usage read "python -m dashboard [OPTIONS] ...".
    app(args=["dashboard", *sys.argv[1:]], prog_name="python -m")
