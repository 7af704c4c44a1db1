"""Flower ClientApp component (``clientapp = "client_app:app"``); the logic is in ``fedrapp_app.federation.client``."""

from fedrapp_app.federation.client import app

__all__ = ["app"]
