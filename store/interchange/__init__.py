"""Data in and out: imports from other agents, exports, native pi sessions, plugin imports."""
