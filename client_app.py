"""Flower ClientApp component (``clientapp = "client_app:app"``); the logic is in ``fedrapp_app.client``."""

from fedrapp_app.client import app

__all__ = ["app"]
