"""The crash matrix: every mutating method × every named fault point its write path passes.

The bar (README §4, RELIABILITY.md rows 1, 9, 17): a retry of any command after a crash at any moment has
exactly one effect, and nothing acknowledged ever drops out of a read. :data:`MATRIX` lists, per mutating
method (``tests/pipeline/scenarios.py`` holds a request and the state it needs for each), every fault point
(``store/faults.py``) its request passes; :func:`test_the_matrix_is_every_point_of_every_write_path` counts
them on a host that never dies and fails when the table is off, so a new write step or method cannot skip the
matrix. :data:`ELSEWHERE` names the cells another module killed and retried before this one; they, and every
point but ``after_commit`` (see :func:`_slow`), are the long tail (``PIHOST_SOAK=1``).

Each cell, black-box against real ``pi-host serve`` processes:

1. the scenario's state is written and acknowledged (and a session ``keep`` with message ``k1``);
2. a host armed with ``RT_CRASHPOINT=<point>:<n>:kill`` acknowledges one more append (``k2``), then gets the
   request with a ``submissionId`` and SIGKILLs itself at the point (``n``: the point's first hit by the
   request, counted on a host that ran the same steps without dying; ``<point>#<k>``: its k-th hit); a point
   reached after the answer went
   out (an append's index commit) kills it just after;
3. a host started again gets the same request with the same ``clientId`` and ``submissionId``. It answers
   what the dead host answered, if it did; else as an uncrashed host answered (the same shape and statuses),
   with the scenario's effect counter moved as far (exactly one effect); or, for a request that had not
   landed when the restart ended what it needed (boot fences a running turn), a definite error (no effect) or
   the documented answer of :data:`AFTER_RESTART`. Every table's row count and each folder's file count equal
   the uncrashed run's (a LIVE method's: a real host's killed just after the answer, or instead of the
   request, then restarted: :func:`live_reference`), and the scenario's session reads over the wire
   (``session.get``: ids, roles, blocks) as the uncrashed run's. A second retry answers the same and changes
   nothing, and ``k1`` and ``k2`` are still read by ``session.get`` and ``search.query``.

Scenarios marked :data:`LIVE` need state a restart ends (a running turn, a held queue lease, an in-flight
checkpoint): their setup runs in the armed host itself, before the request.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, HostClient, RpcError, open_client
from store.revisions import SYNC_MARK_NS
from tests.dbkit import rows
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg, start_host_process
from tests.pipeline import probe
from tests.pipeline.scenarios import SCENARIOS, Scenario
from tests.soak import soaking

# The methods whose setup must run in the armed host (a restart fences running turns and forgets queue leases).
LIVE = frozenset({
    "approvals.request", "approvals.respond", "collab.begin", "collab.settle", "interactions.request",
    "interactions.respond", "plans.finishExecution", "plans.respond", "plans.startExecution", "session.endTurn",
    "session.queueTake", "session.recoverInflight", "session.saveInflightMessage", "tasks.finishRun",
})


def _recovered_by_boot(answer: dict[str, Any]) -> bool:
    """``session.recoverInflight`` after a restart: "boot has already done so, and the call answers
    ``action: "none"`` with the turn ``aborted``, ``INTERRUPTED``" (README, the sidecar's contract)."""
    turn = answer.get("turn") or {}
    return answer.get("action") == "none" and turn.get("status") == "aborted" and turn.get("errorCode") == "INTERRUPTED"


# A LIVE method's documented answer when the request had not landed and the restart ended what it needed,
# and whether its effect happened all the same (boot promoted the checkpoint) or not at all (nothing taken).
AFTER_RESTART: dict[str, tuple[Callable[[dict[str, Any]], bool], bool]] = {
    "session.recoverInflight": (_recovered_by_boot, True),
    # "the queue is held until the sidecar attaches again" (README, the sidecar's contract)
    "session.queueTake": (lambda answer: answer == {"entry": None, "reason": "held"}, False),
}

APPEND = ("append.before_write", "append.after_write", "append.fsync", "append.after_fsync")
INDEX = ("index.before_commit", "index.after_commit")


def _file(prefix: str) -> tuple[str, ...]:
    """The steps of ``store.fsutil.atomic_write`` named ``prefix``."""
    return tuple(f"{prefix}.{step}" for step in ("after_tmp_write", "after_tmp_fsync", "after_rename",
                                                  "before_dirsync"))


def _commit(method: str) -> tuple[str, ...]:
    return f"{method}.before_commit", f"{method}.after_commit"


# The matrix: method -> every fault point its write path passes (the request of its scenario); ``<point>#<k>``:
# the request's k-th hit of a point it passes more than once (k ≥ 2).
MATRIX: dict[str, tuple[str, ...]] = {
    "approvals.removeRule": (*INDEX,),
    "approvals.request": (*INDEX, *_commit("approvals.request")),
    "approvals.respond": (
        *APPEND, *INDEX, *_commit("approvals.respond"), "index.before_commit#2", "index.after_commit#2"
    ),
    "attachments.gc": (
        *INDEX, "index.before_commit#2", "index.after_commit#2", "attachments.gc.after_mark",
        "attachments.gc.before_commit"
    ),
    "attachments.importFile": (
        *INDEX, *_commit("attachments.importFile"), *_file("attachments.meta"), "attachments.import.before_fsync"
    ),
    "attachments.put": (*INDEX, *_commit("attachments.put"), *_file("attachments.meta")),
    "attachments.ref": (*INDEX,),
    "collab.begin": (*APPEND, *INDEX, *_commit("collab.begin"), "queue.between_effects", "queue.after_apply"),
    "collab.cancel": (*INDEX, *_commit("collab.cancel"), "queue.between_effects", "queue.after_apply"),
    "collab.deliver": (*INDEX, *_commit("collab.deliver"), "queue.between_effects", "queue.after_apply"),
    "collab.settle": (*INDEX, *_commit("collab.settle"), "queue.between_effects", "queue.after_apply"),
    "configSync.apply": (  # its rules checked and rolled back (a write of its own) before base.bin is written
        *INDEX, *_commit("configSync.apply"), *_file("configSync.base.bin"), "index.before_commit#2",
        "index.after_commit#2"
    ),
    "configSync.configure": (
        *INDEX, *_commit("configSync.configure"), *_file("secrets.write"), "secrets.write.after_tmp_write#2",
        "secrets.write.after_tmp_fsync#2", "secrets.write.after_rename#2", "secrets.write.before_dirsync#2"
    ),
    "configSync.export": (
        *INDEX, *_commit("configSync.export"), *_file("configSync.pending.bin"), *_file("configSync.pending.receipt")
    ),
    "import.sessions": (
        *INDEX, *_commit("import.sessions"), "index.before_commit#2", "index.after_commit#2", "import.after_link"
    ),
    "interactions.request": (*INDEX, *_commit("interactions.request")),
    "interactions.respond": (
        *APPEND, *INDEX, *_commit("interactions.respond"), "index.before_commit#2", "index.after_commit#2"
    ),
    "models.add": (*INDEX,),
    "models.refresh": (*INDEX, *_commit("models.refresh")),
    "models.remove": (*INDEX,),
    "notifications.clear": (*INDEX,),
    "notifications.markAllRead": (*INDEX,),
    "notifications.markRead": (*INDEX,),
    "plans.finishExecution": (*INDEX, *_commit("plans.finishExecution")),
    "plans.respond": (*INDEX, *_commit("plans.respond")),
    "plans.startExecution": (*INDEX, *_commit("plans.startExecution")),
    "plans.submit": (
        *INDEX, *_commit("plans.submit"), *_file("plans.intent"), "plans.artifact.after_write", "plans.before_row"
    ),
    "plugins.importSession": (*INDEX, *_commit("plugins.importSession"), "import.after_link"),
    "plugins.register": (*INDEX, *_commit("plugins.register"), *_file("plugins.registry")),
    "plugins.setEnabled": (*INDEX, *_commit("plugins.setEnabled"), *_file("plugins.registry")),
    "plugins.uninstall": (
        *INDEX, *_commit("plugins.uninstall"), *_file("plugins.registry"), *_file("plugins.uninstall.intent"),
        "plugins.uninstall.intent.drop.before_unlink", "plugins.uninstall.intent.drop.before_dirsync"
    ),
    "projectGroups.delete": (*INDEX,),
    "projectGroups.save": (*INDEX,),
    "projectGroups.setInstructions": (*INDEX,),
    "projectGroups.setMemory": (*INDEX,),
    "projects.pin": (*INDEX,),
    "projects.remove": (
        *INDEX, *_commit("projects.remove"), *_file("projects.remove.intent"), "index.before_commit#2",
        "index.after_commit#2", "delete.after_marker", "session.delete.before_commit", "session.delete.after_commit",
        "delete.before_files", "session_delete.after_log"
    ),
    "providers.create": (*INDEX, *_commit("providers.create"), *_file("secrets.write")),
    "providers.delete": (*INDEX, *_commit("providers.delete")),
    "providers.reorder": (*INDEX,),
    "providers.sync": (*INDEX, *_commit("providers.sync")),
    "providers.update": (*INDEX, *_commit("providers.update"), *_file("secrets.write")),
    "review.record": (*INDEX, *_commit("review.record"), *_file("review.before"), *_file("review.meta")),
    "review.restore": (
        *INDEX, *_commit("review.restore"), *_file("review.restore_intent"), *_file("review.restored"),
        "review.restore_file.after_tmp_write"
    ),
    "secrets.delete": (
        *INDEX, *_commit("secrets.delete"), *_file("secrets.receipts"), *_file("secrets.trace"),
        "secrets.delete.after_aside"
    ),
    "secrets.set": (*INDEX, *_commit("secrets.set"), *_file("secrets.write")),
    "session.activateRevision": (
        *INDEX, *_commit("session.activateRevision"), *_file("rewrite"), "index.before_commit#2",
        "index.before_commit#3", "index.after_commit#2", "index.after_commit#3", "revisions.after_write",
        "rewrite.before_reindex"
    ),
    "session.appendCompaction": (*APPEND, *INDEX, *_commit("session.appendCompaction")),
    "session.appendMessage": (*APPEND, *INDEX),
    "session.assistantEdit": (
        *INDEX, *_commit("session.assistantEdit"), *_file("assistantEdit.revisions"), *_file("fork"),
        "index.before_commit#2", "index.after_commit#2", "assistantEdit.before_index",
        "assistantEdit.index_before_commit"
    ),
    "session.create": (
        *INDEX, *_commit("session.create"), *_file("create"), "index.before_commit#2", "index.after_commit#2",
        "create.before_index"
    ),
    "session.delete": (
        *INDEX, *_commit("session.delete"), "delete.after_marker", "delete.before_files", "session_delete.after_log"
    ),
    "session.deleteMessage": (*APPEND, *INDEX, *_commit("session.deleteMessage")),
    "session.endTurn": (*INDEX, *_commit("session.endTurn")),
    "session.fork": (
        *INDEX, *_commit("session.fork"), *_file("fork"), "index.before_commit#2", "index.after_commit#2",
        "fork.before_index", "fork.index_before_commit"
    ),
    "session.queueAttach": (*INDEX, *_commit("session.queueAttach")),
    "session.queuePrioritize": (*INDEX, *_commit("session.queuePrioritize"), "queue.after_apply"),
    "session.queuePush": (*INDEX, *_commit("session.queuePush"), "queue.between_effects", "queue.after_apply"),
    "session.queueRemove": (*INDEX, *_commit("session.queueRemove"), "queue.between_effects", "queue.after_apply"),
    "session.queueReorder": (*INDEX, *_commit("session.queueReorder"), "queue.between_effects", "queue.after_apply"),
    "session.queueTake": (*INDEX, *_commit("session.queueTake"), "queue.after_apply"),
    "session.recoverInflight": (
        *APPEND, *INDEX, *_commit("session.recoverInflight"), "index.before_commit#2", "index.after_commit#2"
    ),
    "session.rename": (*APPEND, *INDEX, *_commit("session.rename"), "index.before_commit#2", "index.after_commit#2"),
    "session.replaceMessages": (
        *INDEX, *_commit("session.replaceMessages"), *_file("rewrite"), "index.before_commit#2",
        "index.before_commit#3", "index.after_commit#2", "index.after_commit#3", "rewrite.before_reindex"
    ),
    "session.restoreMessage": (*APPEND, *INDEX, *_commit("session.restoreMessage")),
    "session.saveActiveRevision": (
        *APPEND, *INDEX, *_commit("session.saveActiveRevision"), "index.before_commit#2", "index.before_commit#3",
        "index.after_commit#2", "index.after_commit#3", "revisions.after_write"
    ),
    "session.saveInflightMessage": (*INDEX, *_commit("session.saveInflightMessage"), *_file("inflight")),
    "session.startTurn": (*INDEX, *_commit("session.startTurn")),
    "session.truncateFrom": (
        *INDEX, *_commit("session.truncateFrom"), *_file("rewrite"), "index.before_commit#2", "index.before_commit#3",
        "index.after_commit#2", "index.after_commit#3", "rewrite.before_reindex"
    ),
    "session.update": (*APPEND, *INDEX, *_commit("session.update"), "index.before_commit#2", "index.after_commit#2"),
    "session.updateMetadata": (
        *APPEND, *INDEX, *_commit("session.updateMetadata"), "index.before_commit#2", "index.after_commit#2"
    ),
    "sessions.purge": (
        *INDEX, *_commit("sessions.purge"), "purge.after_marker", "purge.before_files", "session_delete.after_log"
    ),
    "sessions.restore": (
        *APPEND, *INDEX, *_commit("sessions.restore"), "index.before_commit#2", "index.after_commit#2"
    ),
    "sessions.trash": (*APPEND, *INDEX, *_commit("sessions.trash"), "index.before_commit#2", "index.after_commit#2"),
    "settings.delete": (*INDEX,),
    "settings.set": (*INDEX,),
    "settings.update": (*INDEX,),
    "skills.delete": (*INDEX,),
    "skills.put": (*INDEX,),
    "tasks.create": (*INDEX,),
    "tasks.delete": (*INDEX,),
    "tasks.finishRun": (*INDEX,),
    "tasks.startRun": (*INDEX,),
    "tasks.update": (*INDEX,),
    "workspace.open": (*INDEX,),
}
OUTSIDER_SYNC = "acceptance/test_seed003_config_sync_outsider.py"
# The cells another module kills and then retries before this one existed: (method, point) -> that module
# (found by its arming the point within a few lines of calling the method). They run here too, marked slow.
ELSEWHERE: dict[tuple[str, str], str] = {
    ("approvals.respond", "index.before_commit"): "chaos/test_file_first_kill.py",
    ("approvals.respond", "index.after_commit"): "chaos/test_file_first_kill.py",
    ("approvals.respond", "append.after_write"): "chaos/test_file_first_kill.py",
    ("approvals.respond", "append.after_fsync"): "chaos/test_file_first_kill.py",
    ("approvals.respond", "approvals.respond.before_commit"): "chaos/test_file_first_kill.py",
    ("approvals.respond", "approvals.respond.after_commit"): "chaos/test_file_first_kill.py",
    ("attachments.gc", "attachments.gc.after_mark"): "acceptance/test_seed000_tree_outsider.py",
    ("attachments.importFile", "index.before_commit"): "chaos/test_file_first_kill.py",
    ("attachments.importFile", "index.after_commit"): "chaos/test_file_first_kill.py",
    ("attachments.importFile", "attachments.import.before_fsync"): "chaos/test_file_first_kill.py",
    ("attachments.importFile", "attachments.importFile.before_commit"): "chaos/test_file_first_kill.py",
    ("attachments.importFile", "attachments.importFile.after_commit"): "chaos/test_file_first_kill.py",
    ("attachments.put", "index.before_commit"): "attachments/test_gc_crash_retry.py",
    ("attachments.put", "index.after_commit"): "attachments/test_gc_crash_retry.py",
    ("attachments.put", "attachments.meta.after_tmp_fsync"): "attachments/test_db_loss_metadata.py",
    ("attachments.put", "attachments.meta.after_rename"): "attachments/test_db_loss_metadata.py",
    ("collab.begin", "index.before_commit"): "chaos/test_file_first_kill.py",
    ("collab.begin", "append.after_write"): "chaos/test_file_first_kill.py",
    ("collab.begin", "append.after_fsync"): "chaos/test_file_first_kill.py",
    ("collab.begin", "collab.begin.before_commit"): "chaos/test_file_first_kill.py",
    ("collab.begin", "collab.begin.after_commit"): "chaos/test_file_first_kill.py",
    ("collab.deliver", "queue.between_effects"): "collab/test_crash_retry.py",
    ("collab.settle", "collab.settle.before_commit"): "collab/test_crash_retry.py",
    ("collab.settle", "collab.settle.after_commit"): "collab/test_crash_retry.py",
    ("configSync.apply", "configSync.apply.before_commit"): "config_sync/test_apply_crash.py",
    ("configSync.apply", "configSync.apply.after_commit"): "config_sync/test_apply_crash.py",
    ("configSync.apply", "configSync.base.bin.after_tmp_write"): OUTSIDER_SYNC,
    ("configSync.apply", "configSync.base.bin.after_tmp_fsync"): OUTSIDER_SYNC,
    ("configSync.apply", "configSync.base.bin.after_rename"): OUTSIDER_SYNC,
    ("configSync.apply", "configSync.base.bin.before_dirsync"): OUTSIDER_SYNC,
    ("configSync.export", "configSync.pending.bin.after_tmp_write"): OUTSIDER_SYNC,
    ("configSync.export", "configSync.pending.bin.after_tmp_fsync"): OUTSIDER_SYNC,
    ("configSync.export", "configSync.pending.bin.after_rename"): OUTSIDER_SYNC,
    ("configSync.export", "configSync.pending.bin.before_dirsync"): OUTSIDER_SYNC,
    ("configSync.export", "configSync.pending.receipt.after_tmp_write"): OUTSIDER_SYNC,
    ("configSync.export", "configSync.pending.receipt.after_tmp_fsync"): OUTSIDER_SYNC,
    ("configSync.export", "configSync.pending.receipt.after_rename"): OUTSIDER_SYNC,
    ("configSync.export", "configSync.pending.receipt.before_dirsync"): OUTSIDER_SYNC,
    ("import.sessions", "index.before_commit"): "chaos/test_file_first_kill.py",
    ("import.sessions", "index.after_commit"): "chaos/test_file_first_kill.py",
    ("import.sessions", "import.after_link"): "chaos/test_file_first_kill.py",
    ("import.sessions", "import.sessions.before_commit"): "chaos/test_file_first_kill.py",
    ("import.sessions", "import.sessions.after_commit"): "chaos/test_file_first_kill.py",
    ("interactions.respond", "index.before_commit"): "chaos/test_file_first_kill.py",
    ("interactions.respond", "index.after_commit"): "chaos/test_file_first_kill.py",
    ("interactions.respond", "append.after_write"): "chaos/test_file_first_kill.py",
    ("interactions.respond", "append.after_fsync"): "chaos/test_file_first_kill.py",
    ("interactions.respond", "interactions.respond.before_commit"): "chaos/test_file_first_kill.py",
    ("interactions.respond", "interactions.respond.after_commit"): "chaos/test_file_first_kill.py",
    ("plans.respond", "index.before_commit"): "plans/test_plans.py",
    ("plans.respond", "plans.respond.before_commit"): "chaos/test_file_first_kill.py",
    ("plans.submit", "index.before_commit"): "chaos/test_file_first_kill.py",
    ("plans.submit", "index.after_commit"): "chaos/test_file_first_kill.py",
    ("plans.submit", "plans.intent.after_tmp_fsync"): "chaos/test_file_first_kill.py",
    ("plans.submit", "plans.intent.after_rename"): "chaos/test_file_first_kill.py",
    ("plans.submit", "plans.artifact.after_write"): "chaos/test_file_first_kill.py",
    ("plans.submit", "plans.before_row"): "chaos/test_file_first_kill.py",
    ("plans.submit", "plans.submit.before_commit"): "chaos/test_file_first_kill.py",
    ("plans.submit", "plans.submit.after_commit"): "chaos/test_file_first_kill.py",
    ("plugins.importSession", "index.before_commit"): "chaos/test_file_first_kill.py",
    ("plugins.importSession", "index.after_commit"): "chaos/test_file_first_kill.py",
    ("plugins.importSession", "import.after_link"): "acceptance/test_seed003_acceptance_adversarial.py",
    ("plugins.importSession", "plugins.importSession.before_commit"): "chaos/test_file_first_kill.py",
    ("plugins.importSession", "plugins.importSession.after_commit"): "chaos/test_file_first_kill.py",
    ("plugins.register", "plugins.registry.after_tmp_write"): "plugins/test_crash_retry_answers.py",
    ("plugins.register", "plugins.registry.after_rename"): "plugins/test_crash_retry_answers.py",
    ("plugins.register", "plugins.registry.before_dirsync"): "plugins/test_crash_retry_answers.py",
    ("plugins.setEnabled", "plugins.registry.after_tmp_write"): "plugins/test_crash_retry_answers.py",
    ("plugins.setEnabled", "plugins.registry.after_rename"): "plugins/test_crash_retry_answers.py",
    ("plugins.uninstall", "plugins.registry.after_tmp_write"): "plugins/test_crash_retry_answers.py",
    ("plugins.uninstall", "plugins.registry.after_rename"): "plugins/test_crash_retry_answers.py",
    ("plugins.uninstall", "plugins.uninstall.before_commit"): "plugins/test_crash_retry_answers.py",
    ("plugins.uninstall", "plugins.uninstall.after_commit"): "integrity/test_db_loss_receipts.py",
    ("projects.remove", "delete.after_marker"): "projects/test_remove_crash_retry.py",
    ("projects.remove", "projects.remove.after_commit"): "projects/test_remove_crash_retry.py",
    ("review.record", "index.before_commit"): "chaos/test_file_first_kill.py",
    ("review.record", "index.after_commit"): "chaos/test_file_first_kill.py",
    ("review.record", "review.before.after_tmp_write"): "review/test_unpublished_snapshots.py",
    ("review.record", "review.before.after_tmp_fsync"): "review/test_unpublished_snapshots.py",
    ("review.record", "review.before.after_rename"): "acceptance/test_seed003_tail_outsider.py",
    ("review.record", "review.meta.after_tmp_write"): "acceptance/test_seed003_tail_outsider.py",
    ("review.record", "review.meta.after_tmp_fsync"): "chaos/test_file_first_kill.py",
    ("review.record", "review.meta.after_rename"): "chaos/test_file_first_kill.py",
    ("review.record", "review.record.before_commit"): "chaos/test_file_first_kill.py",
    ("review.record", "review.record.after_commit"): "chaos/test_file_first_kill.py",
    ("review.restore", "index.before_commit"): "chaos/test_file_first_kill.py",
    ("review.restore", "index.after_commit"): "chaos/test_file_first_kill.py",
    ("review.restore", "review.restore_intent.after_rename"): "chaos/test_file_first_kill.py",
    ("review.restore", "review.restore_file.after_tmp_write"): "chaos/test_file_first_kill.py",
    ("review.restore", "review.restored.after_tmp_fsync"): "chaos/test_file_first_kill.py",
    ("review.restore", "review.restored.after_rename"): "chaos/test_file_first_kill.py",
    ("review.restore", "review.restore.before_commit"): "chaos/test_file_first_kill.py",
    ("review.restore", "review.restore.after_commit"): "chaos/test_file_first_kill.py",
    ("secrets.delete", "secrets.delete.after_aside"): "acceptance/test_seed003_tasks_outsider.py",
    ("secrets.set", "index.before_commit"): "scheduler/test_secrets_meta_rebuild.py",
    ("secrets.set", "secrets.write.after_tmp_write"): "integrity/test_reliability_outsider_a.py",
    ("secrets.set", "secrets.write.after_tmp_fsync"): "secrets/test_crash_retry_answers.py",
    ("secrets.set", "secrets.write.after_rename"): "secrets/test_crash_retry_answers.py",
    ("secrets.set", "secrets.write.before_dirsync"): "secrets/test_crash_retry_answers.py",
    ("secrets.set", "secrets.set.before_commit"): "integrity/test_secret_retry_after_db_loss.py",
    ("secrets.set", "secrets.set.after_commit"): "acceptance/test_seed003_tasks_outsider.py",
    ("session.activateRevision", "revisions.after_write"): "acceptance/test_seed000_adversarial.py",
    ("session.activateRevision", "rewrite.after_tmp_write"): "revisions/test_rewrite_crash.py",
    ("session.activateRevision", "rewrite.after_rename"): "chaos/test_file_first_kill.py",
    ("session.activateRevision", "rewrite.before_dirsync"): "revisions/test_rewrite_crash.py",
    ("session.activateRevision", "rewrite.before_reindex"): "chaos/test_file_first_kill.py",
    ("session.activateRevision", "session.activateRevision.before_commit"): "chaos/test_file_first_kill.py",
    ("session.activateRevision", "session.activateRevision.after_commit"): "chaos/test_file_first_kill.py",
    ("session.appendMessage", "append.before_write"): "acceptance/test_architecture_outsider.py",
    ("session.appendMessage", "append.after_write"): "acceptance/test_architecture_outsider.py",
    ("session.appendMessage", "append.fsync"): "integrity/test_enospc_sessions_updated_at.py",
    ("session.appendMessage", "append.after_fsync"): "acceptance/test_architecture_outsider.py",
    ("session.appendMessage", "index.before_commit"): "acceptance/test_architecture_outsider.py",
    ("session.appendMessage", "index.after_commit"): "chaos/test_file_first_kill.py",
    ("session.assistantEdit", "assistantEdit.revisions.after_tmp_write"): "integrity/test_reliability_outsider_a.py",
    ("session.assistantEdit", "assistantEdit.revisions.after_tmp_fsync"): "history/test_assistant_edit.py",
    ("session.assistantEdit", "assistantEdit.revisions.after_rename"): "chaos/test_file_first_kill.py",
    ("session.assistantEdit", "fork.after_tmp_write"): "history/test_assistant_edit.py",
    ("session.assistantEdit", "fork.after_rename"): "chaos/test_file_first_kill.py",
    ("session.assistantEdit", "assistantEdit.before_index"): "chaos/test_file_first_kill.py",
    ("session.assistantEdit", "assistantEdit.index_before_commit"): "history/test_assistant_edit.py",
    ("session.assistantEdit", "session.assistantEdit.before_commit"): "chaos/test_file_first_kill.py",
    ("session.assistantEdit", "session.assistantEdit.after_commit"): "chaos/test_file_first_kill.py",
    ("session.create", "index.before_commit"): "acceptance/test_architecture_outsider.py",
    ("session.create", "index.after_commit"): "attachments/test_gc_crash_retry.py",
    ("session.create", "create.after_tmp_write"): "integrity/test_reliability_outsider_a.py",
    ("session.create", "create.after_tmp_fsync"): "chaos/test_file_first_kill.py",
    ("session.create", "create.after_rename"): "chaos/test_file_first_kill.py",
    ("session.create", "create.before_index"): "acceptance/test_architecture_outsider.py",
    ("session.create", "session.create.before_commit"): "chaos/test_file_first_kill.py",
    ("session.create", "session.create.after_commit"): "chaos/test_file_first_kill.py",
    ("session.delete", "index.before_commit"): "acceptance/test_architecture_outsider.py",
    ("session.delete", "delete.after_marker"): "chaos/test_file_first_kill.py",
    ("session.delete", "session.delete.before_commit"): "chaos/test_file_first_kill.py",
    ("session.delete", "session.delete.after_commit"): "chaos/test_file_first_kill.py",
    ("session.delete", "delete.before_files"): "chaos/test_file_first_kill.py",
    ("session.delete", "session_delete.after_log"): "acceptance/test_architecture_outsider.py",
    ("session.deleteMessage", "append.after_fsync"): "acceptance/test_seed000_adversarial.py",
    ("session.deleteMessage", "index.before_commit"): "integrity/test_index_mark.py",
    ("session.endTurn", "index.before_commit"): "acceptance/test_seed003_write_paths_outsider.py",
    ("session.endTurn", "session.endTurn.before_commit"): "acceptance/test_seed003_acceptance_adversarial.py",
    ("session.endTurn", "session.endTurn.after_commit"): "acceptance/test_seed003_tasks_outsider.py",
    ("session.fork", "index.before_commit"): "acceptance/test_architecture_outsider.py",
    ("session.fork", "fork.after_tmp_write"): "history/test_fork_host.py",
    ("session.fork", "fork.after_tmp_fsync"): "history/test_fork_host.py",
    ("session.fork", "fork.after_rename"): "chaos/test_file_first_kill.py",
    ("session.fork", "fork.before_index"): "acceptance/test_architecture_outsider.py",
    ("session.fork", "fork.index_before_commit"): "history/test_fork_host.py",
    ("session.fork", "session.fork.before_commit"): "acceptance/test_seed003_tail_outsider.py",
    ("session.fork", "session.fork.after_commit"): "chaos/test_file_first_kill.py",
    ("session.queueAttach", "index.before_commit"): "acceptance/test_seed003_write_paths_outsider.py",
    ("session.queueAttach", "session.queueAttach.before_commit"): "chaos/test_file_first_kill.py",
    ("session.queueAttach", "session.queueAttach.after_commit"): "chaos/test_file_first_kill.py",
    ("session.queueTake", "index.before_commit"): "acceptance/test_seed003_write_paths_outsider.py",
    ("session.queueTake", "queue.after_apply"): "chaos/test_file_first_kill.py",
    ("session.queueTake", "session.queueTake.before_commit"): "chaos/test_file_first_kill.py",
    ("session.queueTake", "session.queueTake.after_commit"): "chaos/test_file_first_kill.py",
    ("session.recoverInflight", "append.after_fsync"): "chaos/test_file_first_kill.py",
    ("session.recoverInflight", "session.recoverInflight.before_commit"): "chaos/test_file_first_kill.py",
    ("session.recoverInflight", "session.recoverInflight.after_commit"): "chaos/test_file_first_kill.py",
    ("session.rename", "append.after_fsync"): "chaos/test_file_first_kill.py",
    ("session.rename", "session.rename.before_commit"): "chaos/test_file_first_kill.py",
    ("session.rename", "session.rename.after_commit"): "chaos/test_file_first_kill.py",
    ("session.replaceMessages", "rewrite.after_tmp_write"): "integrity/test_reliability_outsider_a.py",
    ("session.replaceMessages", "rewrite.after_tmp_fsync"): "integrity/test_reliability_outsider_a.py",
    ("session.replaceMessages", "rewrite.after_rename"): "chaos/test_file_first_kill.py",
    ("session.replaceMessages", "rewrite.before_dirsync"): "revisions/test_rewrite_crash.py",
    ("session.replaceMessages", "rewrite.before_reindex"): "chaos/test_file_first_kill.py",
    ("session.replaceMessages", "session.replaceMessages.before_commit"): "chaos/test_file_first_kill.py",
    ("session.replaceMessages", "session.replaceMessages.after_commit"): "chaos/test_file_first_kill.py",
    ("session.restoreMessage", "append.after_fsync"): "acceptance/test_seed000_adversarial.py",
    ("session.saveActiveRevision", "revisions.after_write"): "revisions/test_rewrite_crash.py",
    ("session.saveInflightMessage", "inflight.after_tmp_write"): "integrity/test_reliability_outsider_a.py",
    ("session.saveInflightMessage", "inflight.after_tmp_fsync"): "integrity/test_reliability_outsider_a.py",
    ("session.saveInflightMessage", "inflight.after_rename"): "integrity/test_reliability_outsider_a.py",
    ("session.saveInflightMessage", "inflight.before_dirsync"): "integrity/test_reliability_outsider_a.py",
    ("session.startTurn", "index.before_commit"): "acceptance/test_seed003_acceptance_adversarial.py",
    ("session.truncateFrom", "index.before_commit"): "acceptance/test_architecture_outsider.py",
    ("session.truncateFrom", "rewrite.after_tmp_write"): "integrity/test_reliability_outsider_a.py",
    ("session.truncateFrom", "rewrite.after_tmp_fsync"): "integrity/test_reliability_outsider_a.py",
    ("session.truncateFrom", "rewrite.after_rename"): "chaos/test_file_first_kill.py",
    ("session.truncateFrom", "rewrite.before_dirsync"): "revisions/test_rewrite_crash.py",
    ("session.truncateFrom", "rewrite.before_reindex"): "acceptance/test_architecture_outsider.py",
    ("session.truncateFrom", "session.truncateFrom.before_commit"): "chaos/test_file_first_kill.py",
    ("session.truncateFrom", "session.truncateFrom.after_commit"): "chaos/test_file_first_kill.py",
    ("session.update", "append.after_fsync"): "chaos/test_file_first_kill.py",
    ("session.update", "index.before_commit"): "integrity/test_index_mark.py",
    ("session.update", "session.update.before_commit"): "chaos/test_file_first_kill.py",
    ("session.update", "session.update.after_commit"): "chaos/test_file_first_kill.py",
    ("session.updateMetadata", "append.after_fsync"): "chaos/test_file_first_kill.py",
    ("session.updateMetadata", "index.before_commit"): "host/test_first_read.py",
    ("session.updateMetadata", "session.updateMetadata.before_commit"): "chaos/test_file_first_kill.py",
    ("session.updateMetadata", "session.updateMetadata.after_commit"): "chaos/test_file_first_kill.py",
    ("sessions.purge", "index.before_commit"): "chaos/test_file_first_kill.py",
    ("sessions.purge", "index.after_commit"): "chaos/test_file_first_kill.py",
    ("sessions.purge", "purge.after_marker"): "chaos/test_file_first_kill.py",
    ("sessions.purge", "sessions.purge.before_commit"): "chaos/test_file_first_kill.py",
    ("sessions.purge", "sessions.purge.after_commit"): "chaos/test_file_first_kill.py",
    ("sessions.purge", "purge.before_files"): "chaos/test_file_first_kill.py",
    ("sessions.restore", "append.after_fsync"): "chaos/test_file_first_kill.py",
    ("sessions.restore", "sessions.restore.before_commit"): "chaos/test_file_first_kill.py",
    ("sessions.restore", "sessions.restore.after_commit"): "chaos/test_file_first_kill.py",
    ("sessions.trash", "append.after_fsync"): "chaos/test_file_first_kill.py",
    ("sessions.trash", "sessions.trash.before_commit"): "chaos/test_file_first_kill.py",
    ("sessions.trash", "sessions.trash.after_commit"): "chaos/test_file_first_kill.py",
    ("tasks.create", "index.after_commit"): "acceptance/test_seed003_tasks_outsider.py",
    ("tasks.delete", "index.after_commit"): "acceptance/test_seed003_tasks_outsider.py",
    ("tasks.finishRun", "index.after_commit"): "acceptance/test_seed003_tasks_outsider.py",
    ("tasks.startRun", "index.after_commit"): "acceptance/test_seed003_tasks_outsider.py",
}



# The DB-only methods (one writer transaction: effect and receipt) whose index.after_commit runs in CI: one path
# (runtime/pipeline._writer_op), a few handlers; the others' with the long tail.
_WRITER_SAMPLE = frozenset({"attachments.ref", "notifications.markAllRead", "providers.reorder", "settings.update",
                            "tasks.update"})


def _slow(method: str, point: str) -> bool:
    """The long tail (``PIHOST_SOAK=1``): cells another module kills too, and every point but the moment a
    request's effect committed and its answer had not gone out yet (``<method>.after_commit``; a DB-only
    method's ``index.after_commit``, for :data:`_WRITER_SAMPLE`), the lost acknowledgement a retry must be
    answered from."""
    if (method, point) in ELSEWHERE or not point.endswith("after_commit"):
        return True
    if point in INDEX:
        return f"{method}.before_commit" in MATRIX[method] or method not in _WRITER_SAMPLE
    return False


TAIL = [pytest.mark.slow, pytest.mark.skipif(not soaking(), reason="the matrix's long tail runs with PIHOST_SOAK=1")]
CELLS = [(method, point) for method in sorted(MATRIX) for point in MATRIX[method]]


# ------------------------------------------------------------------------------------------- the harness

def _kind(scenario: Scenario) -> tuple[str, str | None]:
    """``(clientKind, pluginId)`` of the scenario's connections."""
    if scenario.kind.startswith("plugin:"):
        return "plugin", scenario.kind.removeprefix("plugin:")
    return scenario.kind, None


@asynccontextmanager
async def _client(url: str, token: str, scenario: Scenario) -> AsyncIterator[HostClient]:
    kind, plugin = _kind(scenario)
    async with open_client(url, token, client_id="same", client_kind=kind, plugin_id=plugin) as c:
        yield c


async def _call(c: HostClient, method: str, params: dict[str, Any]) -> tuple[Any, ...]:
    try:
        return ("ok", await c.call(method, params))
    except RpcError as failed:
        return ("error", failed.data_code)


async def _durable(root: Path, method: str) -> dict[str, Any]:
    """Step 1 on an in-process host: the ``keep`` session, and the scenario's state unless it is LIVE."""
    scenario = SCENARIOS[method]
    async with inprocess_host(root) as host, client_for(host, "keeper", kind="ui") as keeper:
        await keeper.call("session.create", {"sessionId": "keep", "title": "kept"})
        await keeper.call("session.appendMessage", {"sessionId": "keep", "message": msg("k1", "zulu one")})
        if method in LIVE:
            return {}
        async with client_for(host, "setup", kind=scenario.kind) as c:
            return await scenario.setup(c, root)


async def _before_request(c: HostClient, keeper: HostClient, root: Path, method: str,
                          v: dict[str, Any]) -> dict[str, Any]:
    """Step 2 up to the request: the LIVE setup, the ``k2`` append, and an index barrier (a search)."""
    if method in LIVE:
        v = await SCENARIOS[method].setup(c, root)
    await keeper.call("session.appendMessage", {"sessionId": "keep", "message": msg("k2", "yankee two")})
    await keeper.call("search.query", {"query": "yankee"})
    return v


def _params(method: str, v: dict[str, Any]) -> dict[str, Any]:
    return {**SCENARIOS[method].params(v), "submissionId": f"matrix-{method}"}


@dataclass(frozen=True)
class Clean:
    """A request's run on a host that counts fault points and never dies."""

    passed: dict[str, int]
    """Each point the request passed (``<name>`` its first hit, ``<name>#<k>`` its k-th, k ≥ 2), with the
    number of that hit on the host."""
    answer: tuple[Any, ...]
    moved: int | None
    """How far the scenario's counter moved."""
    tables: dict[str, int]
    """Each table's rows afterwards (:func:`_tables`)."""
    read: Any
    """What :data:`READ_BACK` reads afterwards, if it names the method."""
    files: dict[str, int]
    """:func:`_files` afterwards."""
    session: Any = None
    """:func:`_session_view` afterwards."""


# Tables a host's boot or connections write to (one more boot in a crashed run), not a request.
_BOOKKEEPING = ("boot_reports", "messages_fts", "sqlite_")
# kv rows that are a cache, not an effect: a session's revisions sync mark (store/revisions.py, issue 26) is
# written by the first branch read of an actor, which a crashed run's restart makes and an uncrashed run may not.
_KV_CACHES = (SYNC_MARK_NS,)
# Tables whose rows a crashed run may hold otherwise, as documented, and the read that shows the effect whole.
_OTHERWISE: dict[str, tuple[str, ...]] = {
    # "boot restores the child's row and the receipt from the header, and the child's revision rows from its
    # revisions file on first use" (runtime/handlers/assistant_edit.py): session.listRevisions shows them
    "session.assistantEdit": ("message_revisions",),
    # the turn it started was running when the host died: boot fences it, and audits that
    "session.startTurn": ("audit_log",),
    # the plan it submitted was awaiting approval when the host died (killed after its commit): "the boot fence
    # leaves an audit record for each plan/goal approval ... it interrupts" (plan_interrupted, protocol/README)
    "plans.submit": ("audit_log",),
}
READ_BACK: dict[str, Callable[[HostClient, dict[str, Any]], Awaitable[Any]]] = {
    "session.assistantEdit": lambda c, answer: c.call("session.listRevisions",
                                                      {"sessionId": answer["session"]["id"]}),
}


def _files(root: Path) -> dict[str, int]:
    """How many files each top-level folder of the data directory holds (logs and quarantine aside): a
    file a crash left behind, or one effect written twice, shows here."""
    out: dict[str, int] = {}
    for top in sorted(root.iterdir()):
        if top.is_dir() and top.name not in ("logs", "quarantine"):
            out[top.name] = sum(1 for f in top.rglob("*") if not f.is_dir())
    return out


def _differ(now: Any, expected: list[Any]) -> list[Any]:
    """Where ``now`` (tables, files) differs from each of ``expected``."""
    out = []
    for tables, files in expected:
        out.append(({k: (now[0].get(k), n) for k, n in tables.items() if now[0].get(k) != n},
                    {k: (now[1].get(k), n) for k, n in files.items() if now[1].get(k) != n}))
    return out


def _stable(value: Any) -> Any:
    """``value`` without its ids and times (they differ between two data directories)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if not k.endswith(("At", "Id")) and k != "id"}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _tables(root: Path) -> dict[str, int]:
    """How many rows each table holds: one effect more or less than an uncrashed run's shows here."""
    names = [r[0] for r in rows(root, "SELECT name FROM sqlite_master WHERE type = 'table'")
             if not r[0].startswith(_BOOKKEEPING)]
    counts = {name: int(rows(root, f'SELECT COUNT(*) FROM "{name}"')[0][0]) for name in names}  # noqa: S608
    if "kv" in counts:
        marks = ",".join("?" * len(_KV_CACHES))
        counts["kv"] -= int(rows(root, f"SELECT COUNT(*) FROM kv WHERE ns IN ({marks})", *_KV_CACHES)[0][0])  # noqa: S608
    return counts


async def uncrashed(method: str) -> Clean:
    """The same steps on a host that counts fault points and never dies."""
    scenario = SCENARIOS[method]
    folder = Path(tempfile.mkdtemp(prefix="crash-matrix-"))
    try:
        root = folder / "data"
        with trio.fail_after(60):
            v = await _durable(root, method)
            async with inprocess_host(root, faults_spec="crash-matrix.never:1") as host, \
                    client_for(host, "same", kind=scenario.kind) as c, \
                    client_for(host, "keeper", kind="ui") as keeper:
                v = await _before_request(c, keeper, root, method, v)
                await index_caught_up(host)
                before = host.faults.counts()
                counted = scenario.count(root, v) if scenario.count else None
                answer = await _call(c, method, _params(method, v))
                await index_caught_up(host)
                after = host.faults.counts()
                moved = None if counted is None or scenario.count is None else scenario.count(root, v) - counted
                tables = _tables(root)
                read = await READ_BACK[method](c, answer[1]) if method in READ_BACK else None
                session = await _session_view(keeper, method, v)
        passed: dict[str, int] = {}
        for name in after:
            for k in range(1, after[name] - before.get(name, 0) + 1):
                passed[name if k == 1 else f"{name}#{k}"] = before.get(name, 0) + k
        return Clean(passed, answer, moved, tables, read, _files(root), session)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def live_reference(method: str, landed: bool) -> tuple[dict[str, int], dict[str, int]]:
    """A LIVE method's steps on real hosts, SIGKILLed right after the request's answer (``landed``) or in its
    place, restarted, and (``landed``) retried: :func:`_tables` and :func:`_files` then. What a crashed run
    must leave when its request did, or did not, land before the kill."""
    scenario = SCENARIOS[method]
    folder = Path(tempfile.mkdtemp(prefix="crash-matrix-"))
    try:
        root = folder / "data"
        with trio.fail_after(60):
            v = await _durable(root, method)
            params: dict[str, Any] = {}
            first = start_host_process(root)
            try:
                async with _client(first.url, first.token, scenario) as c, \
                        open_client(first.url, first.token, client_id="keeper", client_kind="ui") as keeper:
                    v = await _before_request(c, keeper, root, method, v)
                    params = _params(method, v)
                    if landed:
                        assert (await _call(c, method, params))[0] == "ok"
            finally:
                first.kill9()
            again = start_host_process(root)
            try:
                async with _client(again.url, again.token, scenario) as c, \
                        open_client(again.url, again.token, client_id="keeper", client_kind="ui") as keeper:
                    if landed:
                        assert (await _call(c, method, params))[0] == "ok"
                    await keeper.call("search.query", {"query": "yankee"})
                    return _tables(root), _files(root)
            finally:
                again.kill9()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_STATUS_KEYS = frozenset({"status", "state", "kind", "mode", "action", "outcome", "role", "type", "created",
                          "deduped", "replayed", "enabled", "pinned", "deleted", "removed", "changed"})


def _shape(value: Any, key: str = "") -> Any:
    """What two answers to one request share across hosts: keys, types, list lengths, statuses and flags
    (ids and times differ between two data directories)."""
    if isinstance(value, dict):
        return {k: _shape(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v, key) for v in value]
    if isinstance(value, bool) or key in _STATUS_KEYS:
        return value
    return type(value).__name__


async def _session_view(c: HostClient, method: str, v: dict[str, Any]) -> Any:
    """The scenario's session read over the wire (``session.get``): each message's id, role and blocks, or the
    error the read answers (a deleted session). None for a LIVE method (a restart fences its turn, which an
    uncrashed run's session does not show) and a scenario without a session."""
    if method in LIVE or "sid" not in v:
        return None
    got = await _call(c, "session.get", {"sessionId": v["sid"], "full": True})
    if got[0] != "ok":
        return got
    return [(m["id"], m["role"], m["blocks"]) for m in got[1]["messages"]]


async def _read_keep(c: HostClient) -> tuple[list[str], list[str]]:
    got = await c.call("session.get", {"sessionId": "keep", "full": True})
    found = await c.call("search.query", {"query": "yankee"})
    return [m["id"] for m in got["messages"]], [h["messageId"] for h in found["results"]]


async def run_cell(tmp_path: Path, method: str, point: str, counts: dict[Any, Any]) -> None:
    scenario = SCENARIOS[method]
    if method not in counts:
        counts[method] = await uncrashed(method)
    clean: Clean = counts[method]
    passed, moved = clean.passed, clean.moved
    assert point in passed, f"{method} does not pass {point} (it passes {sorted(passed)})"
    nth = passed[point]
    root = tmp_path / "data"
    v = await _durable(root, method)
    params: dict[str, Any] = {}
    counted: int | None = None
    armed = start_host_process(root, env={"RT_CRASHPOINT": f"{point.partition('#')[0]}:{nth}:kill"})
    answered: Any = None
    try:
        with trio.fail_after(60):
            try:
                async with _client(armed.url, armed.token, scenario) as c, \
                        open_client(armed.url, armed.token, client_id="keeper", client_kind="ui") as keeper:
                    v = await _before_request(c, keeper, root, method, v)
                    params = _params(method, v)
                    counted = scenario.count(root, v) if scenario.count else None
                    answered = await _call(c, method, params)
                    # Acknowledged before the point (an append's index rows follow its answer): it dies next.
                    await trio.to_thread.run_sync(armed.reap)
            except (ClientClosed, OSError):
                pass
            if armed.proc.poll() is None:
                await trio.to_thread.run_sync(armed.reap)
    finally:
        armed.kill9()
    assert armed.proc.returncode == -9, f"the host did not die at {point}:{nth}"

    again = start_host_process(root)
    try:
        with trio.fail_after(60):
            async with _client(again.url, again.token, scenario) as c, \
                    open_client(again.url, again.token, client_id="keeper", client_kind="ui") as keeper:
                retried = await _call(c, method, params)
                effect = None if counted is None or scenario.count is None else scenario.count(root, v) - counted
                if answered is not None:
                    assert retried == answered, "the retry of an acknowledged request answered otherwise"
                    assert effect == moved, f"{method} at {point}: the counter moved {effect}, uncrashed {moved}"
                elif retried[0] == "ok" and method in AFTER_RESTART and AFTER_RESTART[method][0](retried[1]):
                    # Not landed, and the restart settled what it was for (as documented): once, or not at all.
                    once = AFTER_RESTART[method][1] and moved is not None
                    assert effect in ((moved,) if once else (None, 0)), f"{method} at {point}: moved {effect}"
                elif retried[0] == "ok":
                    assert clean.answer[0] == "ok", f"uncrashed: {clean}"
                    assert _shape(retried[1]) == _shape(clean.answer[1]), (retried, clean)
                    assert effect == moved, f"{method} at {point}: the counter moved {effect}, uncrashed {moved}"
                else:
                    # Not landed, and what it needed died with the process: a definite error, no effect.
                    assert method in LIVE, f"{method} at {point}: the retry failed {retried}"
                    assert retried[1] in ("CONFLICT", "NOT_FOUND", "TURN_NOT_RUNNING"), retried
                    assert effect in (None, 0), f"{method} at {point}: failed, yet the counter moved {effect}"
                await keeper.call("search.query", {"query": "yankee"})  # the index covers what is acknowledged
                # what the request left is read over the wire as an uncrashed run reads it
                assert await _session_view(keeper, method, v) == clean.session, f"{method} at {point}: session reads"
                if method in READ_BACK and retried[0] == "ok":
                    read = await READ_BACK[method](c, retried[1])
                    assert _stable(read) == _stable(clean.read), f"{method} at {point}: {read} != {clean.read}"
                skip = _OTHERWISE.get(method, ())
                now = {k: n for k, n in _tables(root).items() if k not in skip}, _files(root)
                if method in LIVE:
                    # Acknowledged: as a run killed just after the answer. Else it landed or did not (a checkpoint
                    # file renamed before the commit is promoted by boot all the same): as one run of the two, but
                    # for receipts (a retry answered with an error stores none; one boot settled stores its own).
                    skip = (*skip, "command_receipts")
                    now = {k: n for k, n in now[0].items() if k not in skip}, now[1]
                    expected = []
                    for landed in (True,) if answered is not None else (True, False):
                        if (method, landed) not in counts:
                            counts[(method, landed)] = await live_reference(method, landed)
                        tables, files = counts[(method, landed)]
                        expected.append(({k: n for k, n in tables.items() if k not in skip}, files))
                    assert now in expected, (f"{method} at {point}: other rows or files than a run not killed",
                                             _differ(now, expected))
                else:
                    assert now[0] == {k: n for k, n in clean.tables.items() if k not in skip}, \
                        f"{method} at {point}: other rows than uncrashed"
                    assert now[1] == clean.files, f"{method} at {point}: other files than uncrashed"
                state = probe.state(root)
                assert await _call(c, method, params) == retried, "a second retry answered otherwise"
                await keeper.call("search.query", {"query": "yankee"})
                assert probe.state(root) == state, f"{method} at {point}: a second retry changed the data"
                listed, found = await _read_keep(keeper)
                assert listed == ["k1", "k2"] and found == ["k2"], (listed, found)
    finally:
        again.kill9()


@pytest.fixture(scope="module")
def counts() -> dict[Any, Any]:
    """Each method's :func:`uncrashed` run and :func:`live_reference` runs, once per module run (a worker's)."""
    return {}


@pytest.mark.parametrize(("method", "point"), [
    pytest.param(method, point, id=f"{method}@{point}", marks=TAIL if _slow(method, point) else [])
    for method, point in CELLS])
async def test_cell(tmp_path: Path, method: str, point: str, counts: dict[Any, Any]) -> None:
    await run_cell(tmp_path, method, point, counts)



async def test_the_matrix_is_every_point_of_every_write_path(counts: dict[Any, Any]) -> None:
    """Every mutating method's request passes exactly the points :data:`MATRIX` lists (a new step or a new
    method fails here until it is in the matrix), and :data:`ELSEWHERE` names cells of the matrix only."""
    assert set(MATRIX) == set(SCENARIOS)
    for method in sorted(MATRIX):
        if method not in counts:
            counts[method] = await uncrashed(method)
        clean: Clean = counts[method]
        assert clean.answer[0] == "ok", (method, clean.answer)
        assert sorted(clean.passed) == sorted(MATRIX[method]), method
    assert set(ELSEWHERE) <= set(CELLS)
