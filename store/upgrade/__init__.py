"""Upgrades: the schema, its migrations, seed-era databases and data directories."""
