"""Evaluation methods (predicting, estimating and probing model performance)."""
