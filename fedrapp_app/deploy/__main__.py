"""``python -m fedrapp_app.deploy``: the same as ``fedrapp-superexec``."""

import sys

from fedrapp_app.deploy.cli import main

if __name__ == "__main__":
    sys.exit(main())
