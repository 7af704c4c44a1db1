"""The method group: the clients' test-time method and its hyperparameters (``fedrapp_app.methods``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedrapp_app.config.keys import Group, Key, Scalar, merged_params, override_hint

#: Run-config keys of each local method's hyperparameters -> the method's parameter names.
METHOD_KEYS: dict[str, dict[str, str]] = {
    "adaprompt": {
        "adaprompt-lr": "lr",
        "adaprompt-threshold": "threshold",
        "adaprompt-buffer-size": "buffer_size",
        "adaprompt-double-softmax": "double_softmax",
        "csc": "csc",
    },
    "tpt": {
        "tpt-lr": "lr",
        "tpt-views": "n_views",
        "tpt-keep-ratio": "keep_ratio",
        "tpt-augmix": "augmix",
        "csc": "csc",
    },
    "im": {
        "im-lr": "lr",
        "im-diversity-weight": "diversity_weight",
        "im-marginal": "marginal",
        "im-ema-momentum": "ema_momentum",
        "csc": "csc",
    },
    "zeroshot": {},
}
METHOD_KEYS["tpt-online"] = METHOD_KEYS["tpt"]


def method_keys(name: str) -> dict[str, str]:
    """The run-config keys of local method ``name`` (a stacked ``base+head``: its base's)."""
    return METHOD_KEYS.get(name.partition("+")[0], {})


def method_values(v: Mapping[str, Scalar], own_prompt: bool) -> dict[str, Any]:
    """The local method's parameters the config gives (its own keys, ``csc``, ``method-params``, and own_prompt
    where the rule or report-own-prompt needs it), checked as :func:`rule_values` does."""
    from fedrapp_app.methods import find_method
    from fedrapp_app.registry.parameters import build_params, field_names

    name = str(v["local-method"])
    spec = find_method(name).target
    fields = field_names(spec.params)
    own_keys = dict(method_keys(name))
    if v["csc"] and "csc" not in own_keys:
        if "csc" not in fields:
            raise ValueError(
                f"csc = true: this method has no class-specific context (fix: {override_hint('csc', False)})"
            )
        own_keys["csc"] = "csc"
    values = merged_params(own_keys, v, "method-params")
    if own_prompt or v["report-own-prompt"]:
        if "own-prompt" not in fields:
            raise ValueError(
                "it cannot score its own last tuned prompt (no own_prompt parameter), which report-own-prompt and "
                "FedRAPP's trust option need"
            )
        values["own_prompt"] = True
    build_params(spec.params, values, f"local method {name!r}")
    return values


GROUP = Group(
    "method",
    "the clients' test-time method",
    (
        Key(
            "csc",
            False,
            "class-specific context (ours): one context per class (CoOp's CSC) in tpt, tpt-online, adaprompt, im",
            everyday=True,
        ),
        Key("adaprompt-lr", 5e-3, "AdaPrompt AdamW learning rate", minimum=0.0, exclusive_minimum=True),
        Key(
            "adaprompt-threshold",
            0.7,
            "AdaPrompt confidence threshold of the buffer",
            minimum=0.0,
            maximum=1.0,
        ),
        Key("adaprompt-buffer-size", 64, "AdaPrompt class-balanced buffer size", minimum=1),
        Key("adaprompt-double-softmax", True, "AdaPrompt reference loss (softmax before cross-entropy)"),
        Key("tpt-lr", 5e-3, "TPT AdamW learning rate", minimum=0.0, exclusive_minimum=True),
        Key("tpt-views", 63, "TPT augmented views per image (plus the original)", minimum=1),
        Key(
            "tpt-keep-ratio",
            0.1,
            "TPT share of lowest-entropy views kept",
            minimum=0.0,
            exclusive_minimum=True,
            maximum=1.0,
        ),
        Key("tpt-augmix", False, "TPT: AugMix on top of the random resized crop + flip views"),
        Key("im-lr", 5e-3, "IM (ours) AdamW learning rate", minimum=0.0, exclusive_minimum=True),
        Key(
            "im-diversity-weight",
            1.0,
            "IM weight of the diversity term (0 = plain entropy minimisation, which collapses)",
            minimum=0.0,
        ),
        Key(
            "im-marginal",
            "batch",
            "IM diversity term: 'batch' = entropy of the batch-mean prediction, 'ema' = "
            "against a running marginal kept on the client",
            choices=("batch", "ema"),
        ),
        Key(
            "im-ema-momentum",
            0.5,
            "IM weight of the past in the running marginal (im-marginal = 'ema')",
            minimum=0.0,
            maximum=0.999,
        ),
        Key(
            "method-params",
            "",
            "parameters of the local method as key=value pairs, e.g. 'lr=0.001 share=0.5' (any method, plugins "
            "included; fedrapp-list shows each method's parameters); a built-in's own key above may not be given "
            "here too",
        ),
    ),
)
