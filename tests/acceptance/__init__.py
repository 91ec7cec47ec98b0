"""Black-box acceptance tests for issues 2 and 3 (storage core, gateway)."""
