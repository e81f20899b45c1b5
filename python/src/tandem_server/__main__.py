"""`python -m tandem_server ARGS` runs the installed `tandem` binary with ARGS."""

import os
import sys

from tandem_server import binary

if __name__ == "__main__":
    exe = binary()
    os.execv(exe, [exe, *sys.argv[1:]])
