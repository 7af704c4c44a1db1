"""``RunConfig``: a validated run config, and what the rest of the app asks of it (the rule's and the method's
parameters, the data spec, the run's name)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedrapp_app.config.data import DATA_KEYS
from fedrapp_app.config.keys import ConfigError, Scalar
from fedrapp_app.config.method import method_values
from fedrapp_app.config.rule import resolve_rule, rule_values
from fedrapp_app.config.schema import check_values
from fedrapp_app.config.trust import rule_name


@dataclass(frozen=True)
class RunConfig:
    """A validated run config: ``values`` maps every key (kebab-case) to its value, defaults included."""

    values: dict[str, Scalar]
    with_rule: bool = True  # the server rule was checked too (not where only clients run: see from_run_config)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], with_rule: bool = True) -> RunConfig:
        """Validate Flower's ``context.run_config`` (or any mapping of overrides); raise ``ConfigError``.

        ``with_rule = False`` leaves the server rule out of the checks: a ClientApp does not run it, and a rule
        plugin need only be installed where the ServerApp runs (docs/extending.md)."""
        values = check_values(run_config, with_rule)
        config = cls(values, with_rule)
        # The data layer checks its own combinations (domains, sources) here, cheaply, and the domain oracle
        # its domain map; with one client per SuperNode (0), on one client until the run has counted them.
        spec = config.data_spec(num_clients=config.num_clients or 1)
        if with_rule and resolve_rule(values).reference:
            _domain_groups(spec)
        return config

    @property
    def num_clients(self) -> int:
        """The number of clients, or 0 while it is "one per SuperNode" and the run has not counted them."""
        return int(self.values["num-clients"])

    def with_num_clients(self, num_clients: int) -> RunConfig:
        """This config with ``num-clients`` resolved (e.g. to the SuperNodes of the run), validated again."""
        return RunConfig.from_run_config({**self.values, "num-clients": int(num_clients)}, self.with_rule)

    def __getitem__(self, key: str) -> Scalar:
        return self.values[key]

    def method_params(self, own_prompt: bool | None = None) -> tuple[str, dict[str, Any]]:
        """Name and hyperparameters of the local method (a registered name or module:Class); ``own_prompt``:
        whether it scores its own last tuned prompt (default: :attr:`reports_own_prompt`; a client is told by
        the server, which knows the rule)."""
        own = self.reports_own_prompt if own_prompt is None else own_prompt
        return str(self.values["local-method"]), method_values(self.values, own)

    @property
    def reports_own_prompt(self) -> bool:
        """Whether clients score their own last tuned prompt on each batch (H_own): asked for, or read by the
        server rule (FedRAPP's trust option)."""
        return bool(self.values["report-own-prompt"]) or resolve_rule(self.values).reads_own_prompt

    def rule_params(self) -> tuple[str, dict[str, Any]]:
        """Registry name and hyperparameters of the server rule."""
        reference = resolve_rule(self.values).reference
        return rule_name(self.values), rule_values(self.values, self.domain_groups() if reference else (0,))

    def domain_groups(self) -> tuple[int, ...]:
        """Each client's shift-domain index (testbed only); ``ConfigError`` where no domain map exists."""
        return _domain_groups(self.data_spec())

    def data_spec(self, **overrides: Scalar):
        """The data layer's spec (``fedrapp_app.data.DataSpec``), validated; ``overrides`` by field name."""
        from fedrapp_app.data import DataSpec, validate_spec

        if not self.num_clients and "num_clients" not in overrides:
            raise ConfigError("num-clients = 0 (one client per SuperNode) must be resolved first: with_num_clients(n)")
        spec = DataSpec(**{**{field: self.values[key] for key, field in DATA_KEYS.items()}, **overrides})
        try:
            validate_spec(spec)
        except ValueError as err:
            raise ConfigError(f"invalid run config:\n  {err}") from err
        return spec

    def run_name(self) -> str:
        """The results folder's name: ``run-name`` or one derived from the main choices."""
        if self.values["run-name"]:
            return str(self.values["run-name"])
        v = self.values
        model = str(v["model"]).rstrip("/").split("/")[-1]
        return f"{v['dataset']}-{model}-{v['local-method']}-{v['strategy']}-seed{v['seed']}"


def _domain_groups(spec) -> tuple[int, ...]:
    """Each client's shift-domain index under ``spec`` (a ``DataSpec``); ``ConfigError`` without a domain map."""
    from fedrapp_app.data import client_domains

    domains = client_domains(spec)
    if any(d is None for d in domains):
        raise ConfigError(
            "invalid run config:\n  strategy = 'domain-oracle': it needs every client's shift domain, which "
            "only the testbed with testbed-domains and shift='fixed' has; it is a reference, not a deployable strategy"
        )
    index = {d: i for i, d in enumerate(dict.fromkeys(domains))}
    return tuple(index[d] for d in domains)
