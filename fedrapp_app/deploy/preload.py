"""What the worker server imports once, before it forks a worker per run (the libraries a round needs).

Only third-party libraries and the worker itself: the app's own modules (``fedrapp_app.federation.client`` and what it
imports, the FAB's ``client_app``) are imported fresh in each run's worker, so a reinstalled app takes
effect from the next run, as with Flower's per-task processes. Importing these runs no computation: no
thread pool or device is started before the fork.
"""

from __future__ import annotations

import numpy  # noqa: F401
import PIL.Image  # noqa: F401
import torch  # noqa: F401
from flwr.clientapp import ClientApp  # noqa: F401
from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, CLIPConfig, CLIPModel  # noqa: F401

import fedrapp_app.deploy.worker  # noqa: F401
