"""FedRAPP: federated test-time prompt tuning for CLIP, as a Flower app.

The package's folders name its layers (docs/ARCHITECTURE.md): ``engine``, ``data``, ``testbed``, ``metrics``
and ``plugins`` at the bottom; ``methods`` and ``aggregation`` on them; ``config``; ``recording`` and
``federation`` (the Flower app); ``bench``, ``report``, ``running`` (``fedrapp-sim``) and ``deploy`` on top.

Modules that lived at the package's top before it was regrouped still import under their old names, with a
``DeprecationWarning`` that names the new one (``MOVED``), so plugins written against them keep working.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

__version__ = "0.1.0"

#: Old module -> where it lives now.
MOVED = {
    "fedrapp_app.attacks": "fedrapp_app.federation.attacks",
    "fedrapp_app.builtins": "fedrapp_app.registry.builtins",
    "fedrapp_app.calibration": "fedrapp_app.metrics.calibration",
    "fedrapp_app.catalogue": "fedrapp_app.plugins.catalogue",
    "fedrapp_app.checkpoint": "fedrapp_app.recording.checkpoint",
    "fedrapp_app.client": "fedrapp_app.federation.client",
    "fedrapp_app.config_docs": "fedrapp_app.config.docs",
    "fedrapp_app.errors": "fedrapp_app.federation.errors",
    "fedrapp_app.inprocess": "fedrapp_app.federation.inprocess",
    "fedrapp_app.launch": "fedrapp_app.running.launch",
    "fedrapp_app.parameters": "fedrapp_app.registry.parameters",
    "fedrapp_app.population": "fedrapp_app.federation.population",
    "fedrapp_app.preflight": "fedrapp_app.running.preflight",
    "fedrapp_app.processes": "fedrapp_app.running.processes",
    "fedrapp_app.records": "fedrapp_app.federation.records",
    "fedrapp_app.results": "fedrapp_app.recording.results",
    "fedrapp_app.runlock": "fedrapp_app.recording.runlock",
    "fedrapp_app.server": "fedrapp_app.federation.server",
    "fedrapp_app.strategy": "fedrapp_app.federation.strategy",
    "fedrapp_app.switches": "fedrapp_app.metrics.switches",
}


class _MovedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name as the module at its new place (one module object under both names)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}: import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        """Nothing to run: the module at its new place is already imported."""

    def get_code(self, fullname):
        """``python -m <old name>``: refused, naming the new one."""
        raise ImportError(f"{fullname} moved to {MOVED[fullname]}: run python -m {MOVED[fullname]}")


if not any(isinstance(finder, _MovedModule) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModule())
