"""Flower ServerApp component (``serverapp = "server_app:app"``); the logic is in ``fedrapp_app.federation.server``."""

from fedrapp_app.federation.server import app

__all__ = ["app"]
