"""Uncertainty for every reported number (bootstrap CIs, paired tests, claim checks), timing and seeding."""
