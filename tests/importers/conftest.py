from tests.samplekit import db, target, untouched_samples

__all__ = ["db", "target", "untouched_samples"]
