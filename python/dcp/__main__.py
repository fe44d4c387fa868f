"""`python -m dcp ...`: the dcp command line (see _dcp_command, which the
wheel's `dcp` script runs without importing this package)."""

import sys

from _dcp_command import main, tool_path  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
