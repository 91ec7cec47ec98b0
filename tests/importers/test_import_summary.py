"""An import's summary stays bounded whatever the number of sessions (issue 26 item 5).

Reproduces: ``import_root`` (the store-only path) kept every session's report in its summary, so what it
held grew with the directory, while the host's ``import.sessions`` kept its totals and at most
``MAX_IMPORT_REPORTS`` reports. Both now keep one :class:`ImportSummary`.
"""

from __future__ import annotations

from collections import Counter

from store.interchange.importers.report import FileReport, SessionReport
from store.interchange.imports import ImportSummary


def _report(n: int, status: str, *, unknown: str | None = None) -> SessionReport:
    rep = SessionReport("claude-code", f"ext-{n}", f"sid-{n}", status=status,
                        messages=Counter({"user": 2, "assistant": 3}), new_messages=5, hidden_off_branch=1,
                        files=[FileReport(f"/src/{n}.jsonl", consumed=100,
                                          unknown=Counter({unknown: 1}) if unknown else Counter())])
    return rep if status != "refused" else rep.refuse("EMPTY_SESSION", "no messages")


def test_the_totals_count_every_session_and_only_max_reports_reports_are_kept_the_refused_first() -> None:
    summary = ImportSummary(max_reports=3)
    reports = [_report(n, "refused" if n in (4, 7) else "new", unknown="odd" if n == 1 else None) for n in range(10)]
    for rep in reports:
        summary.add(rep)
    assert summary.done == 10
    assert summary.counts() == {"new": 8, "refused": 2}
    assert summary.messages == 8 * 5 and summary.new_messages == 8 * 5 and summary.hidden == 8
    assert summary.source_bytes == 10 * 100
    assert summary.unknown == Counter({"odd": 1})
    assert [r.external_id for r in summary.sessions] == ["ext-4", "ext-7", "ext-0"]
    assert summary.truncated
    assert len(summary.refused) <= 3 and len(summary.others) == 3  # what is held stops growing
    as_dict = summary.to_dict()
    assert as_dict["counts"] == {"new": 8, "refused": 2} and as_dict["truncated"] is True
    assert [s["externalId"] for s in as_dict["sessions"]] == ["ext-4", "ext-7", "ext-0"]


def test_a_summary_under_its_bound_keeps_every_report_in_order() -> None:
    summary = ImportSummary()
    for n in range(3):
        summary.add(_report(n, "new"))
    assert [r.external_id for r in summary.sessions] == ["ext-0", "ext-1", "ext-2"]
    assert not summary.truncated
