"""The registry: where server rules and local methods come from, and what they take.

- ``entry_points``: the entry-point groups (``fedrapp.rules``, ``fedrapp.methods``) and ``module:attribute``
  references, for the built-ins and plugins alike; errors that name the plugin and the fix.
- ``builtins``: the names of this project's own rules and methods (its entry points), for the docs.
- ``parameters``: a rule's or method's parameters (a dataclass with defaults) built from config values.

Only light imports: the lookups run in the pre-start checks. ``aggregation`` and ``methods`` find their rules and
methods through it; ``fedrapp_app.plugins`` is the side a plugin author and ``fedrapp-list`` see.
"""
