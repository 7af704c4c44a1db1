"""FedRAPP: federated test-time prompt tuning for CLIP, as a Flower app."""

__version__ = "0.1.0"
