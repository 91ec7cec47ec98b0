"""The route table: where every wire method goes and which handler runs it.

One line per method. The wire contract (params model, result model, whether
it mutates, its errors) is ``protocol/methods.py``; a route adds the target:

* ``on_session``  — the session actor named by ``params.session_id`` (or by
  ``session=``): the handler ``(SessionContext, params, receipt)`` runs inside
  that actor, serialized with every other request of the session;
* ``in_writer``   — a DB-only method: ``(WriterContext, params, receipt)`` runs
  inside the DB writer's batch transaction, receipt row included;
* ``from_reads``  — a read: ``(ReadContext, params)`` on one read-pool snapshot,
  after the index barrier when ``barrier=True``;
* ``on_host``     — several steps (a file in a worker thread, then a
  transaction; or several session actors): ``(HostContext, params, receipt)``;
* ``on_connection`` — served by the gateway connection itself.

``tests/pipeline`` checks the table against the wire registry (every method
routed, every handler typed with its method's params model) and generates the
receipt and ordering tests from it, so a new method cannot skip them. The
pipeline orders a connection's requests by a route's target (``Via``) and
whether its method mutates (``runtime/ordering.py``); ``test_ordering_pairs``
has a case for every pair of those kinds and asks every route for its kind.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from runtime.handlers import (
    appends,
    approvals,
    artifacts,
    assistant_edit,
    attachments,
    audit,
    catalog,
    collab,
    compaction,
    config_sync,
    context,
    export,
    fork,
    host,
    imports,
    inflight,
    logs,
    native_pi,
    notifications,
    plans,
    plugin_imports,
    plugins,
    project_groups,
    projects,
    providers,
    queue,
    review,
    revisions,
    search,
    secrets,
    sessions,
    settings,
    skills,
    tasks,
    tombstones,
    trash,
    turns,
    usage,
    workspace,
)

__all__ = ["ROUTES", "Route", "Via"]


class Via(enum.Enum):
    SESSION = "session"
    WRITER = "writer"
    READS = "reads"
    HOST = "host"
    CONNECTION = "connection"


@dataclass(frozen=True, slots=True)
class Route:
    via: Via
    handler: Any = None
    group: Any = None
    """SESSION: consecutive calls in the actor's mailbox are handled together by ``group(ctx, calls)``."""
    session: Callable[..., Awaitable[str]] | None = None
    """SESSION: ``(services, params, receipt) -> session id`` when it is not ``params.session_id``."""
    ready_check: bool = True
    """SESSION: False when the handler establishes the session itself (create makes it; get reads it cold)."""
    replayed: Any = None
    """SESSION: ``(ctx, params, receipt)`` run before a keyed retry is answered from its receipt
    (``SessionOp.replayed``: an effect held in process memory, which a restart forgot)."""
    barrier: bool = False
    """READS: wait until the index covers every append acknowledged before the read arrived."""
    receipt_answer: Callable[..., Awaitable[Any]] | None = None
    """HOST: ``(ctx, stored) -> answer`` when the receipt row holds a stand-in for the answer, not the answer
    (its bulk stays in a file: ``configSync.export``'s bundle, seed 003 §1.3 "the DB stores no large
    payloads"; the handler commits with ``HostContext.commit(..., stand_in=...)``): a keyed retry answered from
    the row gets this."""
    fingerprint: Callable[..., Awaitable[str]] | None = None
    """``(services, method, raw params) -> fingerprint`` when the plain one would hold a secret."""
    legacy_fingerprint: Callable[..., Awaitable[str]] | None = None
    """``(services, method, raw params) -> fingerprint`` an earlier build stored for the same request
    (``ReceiptKey.legacy_fingerprint``: its receipts still answer a retry after an in-place upgrade)."""
    native: Any = None
    """SESSION: the host handler ``(HostContext, params, receipt)`` for a native pi session id
    (``native-pi:...``, seed §12); a route without one refuses such ids (UNSUPPORTED_FOR_NATIVE_SESSION)."""
    message_ids: Callable[[Any], tuple[str, ...]] | None = None
    """SESSION: the message ids the request writes (``params -> ids``). Two requests writing one id
    to two sessions do not run at once: the second waits for the first's answer, so its session
    sees the id held and remaps it (D444) before it answers, never the index after."""
    direct: Callable[..., Awaitable[Any]] | None = None
    """SESSION (a read): ``(services, params, caller) -> result | None``, tried first while the session has
    no actor running (none in this process, or it passivated): served from the request's own task in one
    read-pool hop, no actor started; ``None`` hands the request to the actor as usual. It must be exactly
    what the actor would answer to a cold read (see ``sessions.get_direct``). A result (not ``None``) comes
    after a checkpoint of its own (its read-pool hop): ``Pipeline.call`` passes on it without another."""
    writes: bool = False
    """Ordered as a write though its params take no ``submissionId`` (``logs.append``): later requests
    of the connection wait for it, and two of them apply in frame order."""
    plugins: bool = False
    """Open to plugin connections (``clientKind: "plugin"``); the handler scopes what a plugin
    sees and changes to what it owns (``runtime/handlers/plugins.require_owner``). Every other
    route answers a plugin ``PERMISSION_DENIED``."""


def on_session(handler: Any, **options: Any) -> Route:
    return Route(Via.SESSION, handler, **options)


def in_writer(handler: Any, **options: Any) -> Route:
    return Route(Via.WRITER, handler, **options)


def from_reads(handler: Any, *, barrier: bool = False, **options: Any) -> Route:
    return Route(Via.READS, handler, barrier=barrier, **options)


def on_host(handler: Any, **options: Any) -> Route:
    return Route(Via.HOST, handler, **options)


def on_connection() -> Route:
    return Route(Via.CONNECTION)


ROUTES: Mapping[str, Route] = MappingProxyType({
    # host and connection
    "host.hello":                  on_connection(),
    "host.status":                 on_host(host.status),
    "host.createLoginCode":        on_host(host.create_login_code),
    "logs.append":                 on_host(logs.append, writes=True),
    "events.subscribe":            on_connection(),
    "events.unsubscribe":          on_connection(),
    # sessions
    "session.create":              on_session(sessions.create, session=sessions.create_target, ready_check=False),
    "session.list":                on_host(native_pi.list_sessions, plugins=True),  # + native pi sessions (§12)
    "session.get":                 on_session(sessions.get, ready_check=False, native=native_pi.get, plugins=True,
                                              direct=sessions.get_direct),
    "session.appendMessage":       on_session(appends.append, group=appends.append_group,
                                              message_ids=lambda p: (p.message.id,)),
    "session.rename":              on_session(sessions.rename),
    "session.update":              on_session(sessions.update),
    "session.updateMetadata":      on_session(sessions.update_metadata),
    "session.delete":              on_session(sessions.delete),
    # turns, in-flight checkpoints, notifications, artifacts
    "session.startTurn":           on_session(turns.start_turn),
    "session.endTurn":             on_session(turns.end_turn),
    "session.turnEnvironment":     from_reads(turns.turn_environment),
    "session.verifyEnvironment":   on_session(turns.verify_environment),
    "session.saveInflightMessage": on_session(inflight.save),
    "session.recoverInflight":     on_session(inflight.recover, replayed=inflight.recover_replayed),
    "notifications.list":          from_reads(notifications.list_notifications),
    "notifications.markRead":      in_writer(notifications.mark_read),
    "notifications.markAllRead":   in_writer(notifications.mark_all_read),
    "notifications.clear":         in_writer(notifications.clear),
    "artifacts.list":              from_reads(artifacts.list_artifacts, barrier=True),
    "audit.list":                  from_reads(audit.list_audit, barrier=True),
    # the turn queue
    "session.queuePush":           on_session(queue.push),
    "session.queueList":           on_session(queue.list_queue),
    "session.queueRemove":         on_session(queue.remove),
    "session.queuePrioritize":     on_session(queue.prioritize),
    "session.queueReorder":        on_session(queue.reorder),
    "session.queueAttach":         on_session(queue.attach, replayed=queue.attach_replayed),
    "session.queueTake":           on_session(queue.take),
    # revisions, rewrites, compaction
    "session.saveActiveRevision":  on_session(revisions.save_active),
    "session.activateRevision":    on_session(revisions.activate),
    "session.listRevisions":       on_session(revisions.list_revisions),
    "session.truncateFrom":        on_session(revisions.truncate_from),
    "session.replaceMessages":     on_session(revisions.replace_messages),
    "session.appendCompaction":    on_session(compaction.append_compaction),
    # tombstones, fork, derived views
    "session.fork":                on_session(fork.fork, native=native_pi.fork),
    "session.assistantEdit":       on_session(assistant_edit.assistant_edit),
    "session.deleteMessage":       on_session(tombstones.delete_message),
    "session.restoreMessage":      on_session(tombstones.restore_message),
    "session.tree":                on_session(context.tree),
    "session.context":             on_session(context.context),
    # review-change snapshots (§2.0)
    "review.record":               on_session(review.record),
    "review.get":                  on_session(review.get),
    "review.list":                 on_session(review.list_snapshots),
    "review.restore":              on_session(review.restore),
    # search
    "search.sessions":             from_reads(search.sessions, barrier=True),
    "search.query":                from_reads(search.query, barrier=True),
    # secrets
    "secrets.set":                 on_host(secrets.set_secret, fingerprint=secrets.fingerprint,
                                           legacy_fingerprint=secrets.legacy_fingerprint),
    "secrets.get":                 on_host(secrets.get),
    "secrets.delete":              on_host(secrets.delete),
    "secrets.list":                from_reads(secrets.list_secrets),
    # attachments
    "attachments.put":             on_host(attachments.put),
    "attachments.importFile":      on_host(attachments.import_file),
    "attachments.ref":             in_writer(attachments.ref),
    "attachments.get":             from_reads(attachments.get),
    "attachments.estimate":        from_reads(attachments.estimate),
    "attachments.gc":              on_host(attachments.gc),
    # scheduled tasks
    "tasks.create":                in_writer(tasks.create),
    "tasks.update":                in_writer(tasks.update),
    "tasks.delete":                in_writer(tasks.delete),
    "tasks.list":                  from_reads(tasks.list_tasks),
    "tasks.get":                   from_reads(tasks.get),
    "tasks.runs":                  from_reads(tasks.runs),
    "tasks.startRun":              in_writer(tasks.start_run),
    "tasks.finishRun":             in_writer(tasks.finish_run),
    # plan / goal approvals
    "plans.submit":                on_session(plans.submit),
    "plans.pending":               from_reads(plans.pending),
    "plans.respond":               on_session(plans.respond, session=plans.respond_target),
    "plans.startExecution":        on_session(plans.start_execution),
    "plans.finishExecution":       on_session(plans.finish_execution),
    # pending user requests: tool permissions and questions
    "approvals.request":           on_session(approvals.request_approval),
    "approvals.pending":           from_reads(approvals.pending_approvals),
    "approvals.respond":           on_session(approvals.respond_approval),
    "approvals.rules":             from_reads(approvals.rules),
    "approvals.removeRule":        in_writer(approvals.remove_rule),
    "interactions.request":        on_session(approvals.request_interaction),
    "interactions.pending":        from_reads(approvals.pending_interactions),
    "interactions.respond":        on_session(approvals.respond_interaction),
    # the session collaboration ledger
    "collab.deliver":              on_session(collab.deliver, session=collab.deliver_target),
    "collab.begin":                on_session(collab.begin),
    "collab.settle":               on_session(collab.settle),
    "collab.cancel":               on_session(collab.cancel, session=collab.cancel_target),
    "collab.list":                 from_reads(collab.list_deliveries),
    "collab.get":                  from_reads(collab.get),
    # usage
    "usage.session":               from_reads(usage.session_usage),
    "usage.history":               from_reads(usage.history),
    "session.listTurns":           from_reads(usage.list_turns),
    # projects
    "projects.list":               from_reads(projects.list_projects),
    "projects.remove":             on_host(projects.remove),
    # settings
    "settings.get":                from_reads(settings.get, plugins=True),
    "settings.set":                in_writer(settings.set_value, plugins=True),
    # configuration (issue 13): settings, workspace, groups, providers, models, plugins, config sync
    "settings.getAll":             from_reads(settings.get_all, plugins=True),
    "settings.update":             in_writer(settings.update, plugins=True),
    "settings.delete":             in_writer(settings.delete, plugins=True),
    # skills and memories (seed 000 §2)
    "skills.list":                 from_reads(skills.list_skills),
    "skills.get":                  from_reads(skills.get),
    "skills.put":                  in_writer(skills.put),
    "skills.delete":               in_writer(skills.delete),
    "memories.list":               from_reads(skills.list_memories),
    "workspace.open":              in_writer(workspace.open_workspace),
    "workspace.get":               from_reads(workspace.get),
    "session.resolvePath":         from_reads(workspace.resolve_path),
    "projects.pin":                in_writer(projects.pin),
    "projectGroups.list":          from_reads(project_groups.list_groups),
    "projectGroups.get":           from_reads(project_groups.get),
    "projectGroups.save":          in_writer(project_groups.save),
    "projectGroups.delete":        in_writer(project_groups.delete),
    "projectGroups.setMemory":     in_writer(project_groups.set_memory),
    "projectGroups.setInstructions": in_writer(project_groups.set_instructions),
    "providers.list":              from_reads(providers.list_providers, plugins=True),
    "providers.get":               from_reads(providers.get, plugins=True),
    "providers.create":            on_host(providers.create, fingerprint=providers.fingerprint),
    "providers.update":            on_host(providers.update, fingerprint=providers.fingerprint),
    "providers.delete":            on_host(providers.delete),
    "providers.reorder":           in_writer(providers.reorder),
    "providers.sync":              on_host(providers.sync, plugins=True),
    "models.list":                 from_reads(catalog.list_models, plugins=True),
    "models.add":                  in_writer(catalog.add),
    "models.remove":               in_writer(catalog.remove),
    "models.refresh":              on_host(catalog.refresh),
    "plugins.list":                on_host(plugins.list_plugins),
    "plugins.register":            on_host(plugins.register),
    "plugins.setEnabled":          on_host(plugins.set_enabled),
    "plugins.uninstall":           on_host(plugins.uninstall),
    "plugins.listAssets":          on_host(plugins.list_assets, plugins=True),
    "plugins.getAsset":            on_host(plugins.get_asset, plugins=True),
    "configSync.get":              on_host(config_sync.get),
    "configSync.configure":        on_host(config_sync.configure, fingerprint=config_sync.fingerprint),
    "configSync.export":           on_host(config_sync.export, receipt_answer=config_sync.export_answer),
    "configSync.apply":            on_host(config_sync.apply),
    # history in and out: imports, plugin imports, trash, export (each imported session in its actor)
    "import.sessions":             on_host(imports.import_sessions),
    "plugins.importSession":       on_host(plugin_imports.import_session, plugins=True),
    "plugins.listSessions":        from_reads(plugin_imports.list_sessions, barrier=True, plugins=True),
    "sessions.trash":              on_session(trash.trash, plugins=True),
    "sessions.restore":            on_session(trash.restore, plugins=True),
    "sessions.purge":              on_session(trash.purge, plugins=True),
    "sessions.listTrashed":        from_reads(trash.list_trash, barrier=True, plugins=True),
    "session.export":              on_session(export.export, native=export.export_native_session, plugins=True),
})
