"""Plugins, as their authors and users see them: ``fedrapp-list`` (``catalogue``) over every rule and method the
registry finds (``fedrapp_app.registry``: entry points, ``module:attribute`` references, parameters).

The registry's names are re-exported here, so ``from fedrapp_app.plugins import PluginError`` works as it did when
``fedrapp_app.plugins`` was the registry module itself.
"""

from fedrapp_app.registry.entry_points import (
    KIND,
    METHODS,
    RULES,
    Found,
    PluginError,
    find,
    is_reference,
    names,
    registered,
)

__all__ = ["KIND", "METHODS", "RULES", "Found", "PluginError", "find", "is_reference", "names", "registered"]
