"""Adaptation methods (fine-tuning initialisation, representation interventions, federated learning, merging)."""
