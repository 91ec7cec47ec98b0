"""Search over the index: queries, literal text matching, FTS5 upkeep."""
