"""Flower ServerApp component (``serverapp = "server_app:app"``); the logic is in ``fedrapp_app.server``."""

from fedrapp_app.server import app

__all__ = ["app"]
