"""Transcript files and windows: the JSONL format, appends and rewrites, layout, window reads."""
