"""The SQLite index: opening it, group commit, the rows derived from transcripts, reconciliation, cursors."""
