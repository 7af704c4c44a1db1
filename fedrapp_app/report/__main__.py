"""``python -m fedrapp_app.report RUN_DIR [RUN_DIR ...] [--out DIR]``."""

import sys

from fedrapp_app.report.cli import main

sys.exit(main())
