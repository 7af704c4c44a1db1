"""``python -m fedrapp_app.config [--sync | --pyproject]``: the config's documents (``docs.py``)."""

from fedrapp_app.config.docs import main

main()
