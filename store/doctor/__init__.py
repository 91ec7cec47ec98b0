"""``pi-host doctor``: offline checks of a stopped host's data directory, and their report."""
