"""The actor kernel: mailbox actors and their supervision (nothing above it is imported here)."""
