"""``python -m nvfp4compat``: the same CLI as the ``nvfp4compat`` console script."""

import sys

from nvfp4compat.cli import main

if __name__ == "__main__":
    sys.exit(main())
