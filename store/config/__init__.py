"""Configuration: settings, providers, the model catalog, secrets, credential rules, config sync."""
