"""Tables of the saga store (SQLAlchemy Core). Migrations in ``migrations/`` mirror them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    DDL,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    event,
    text,
)
from sqlalchemy.dialects import mysql

metadata = MetaData()

#: MySQL's BLOB stops at 64 KiB; payloads may be larger.
Blob = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
#: MySQL's DATETIME drops sub-second precision unless asked.
Timestamp = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: MySQL's TEXT stops at 64 KiB; a saga of many steps has a longer shape.
ShapeText = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")
#: SQLite only autoincrements INTEGER PRIMARY KEY.
RecordId = BigInteger().with_variant(Integer(), "sqlite")


def _run_id(**options: Any) -> Column[Any]:
    """The ``execution_id`` column of a run's child table: its rows go with the run."""
    return Column(
        "execution_id",
        String(64),
        ForeignKey("saga_executions.id", ondelete="CASCADE"),
        **options,
    )


executions = Table(
    "saga_executions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("saga_name", String(200), nullable=False),
    Column("definition_hash", String(64), nullable=False),
    Column("state", String(32), nullable=False),
    Column("cursor", Integer, nullable=False),
    Column("cursor_sub", Integer, nullable=False),
    Column("input", Blob, nullable=False),
    Column("failure_reason", Text),
    Column("rollback_status", String(32)),
    Column("rollback_reason", Text),
    Column("committed_at", Timestamp),
    Column("parent_execution_id", String(64)),
    Column("lease_expires_at", Timestamp),
    Column("wake_at", Timestamp),
    Column("created_at", Timestamp, nullable=False),
    Column("updated_at", Timestamp, nullable=False),
    Column("version", Integer, nullable=False),
    # Set when a cancel is stored: the unwind then ends in ``cancelled``.
    Column("cancelled_at", Timestamp),
    # When a live run is cancelled by the timer sweep; cleared when it ends.
    Column("deadline_at", Timestamp),
    # The members of the parallel group at the cursor that settled, and failed (a member
    # that brings the first to the group's size joins it); NULL: not counted yet.
    Column("members_settled", Integer),
    Column("members_failed", Integer),
    # The flow-control key the run was admitted or queued under (NULL: its saga has no limit).
    Column("flow_key", String(200)),
    # The W3C traceparent of the run's root span (celery_saga.tracing), written with the
    # run's INSERT; NULL when tracing was off at its start.
    Column("trace_context", String(64)),
    Index("ix_saga_executions_listing", "created_at", "id"),
    # No index may hold a column that every step changes (updated_at, version, cursor):
    # PostgreSQL then rewrites the run row in place (HOT). See migration 0003.
    Index("ix_saga_executions_state_created", "state", "created_at", "id"),
    Index("ix_saga_executions_saga", "saga_name", "created_at", "id"),
    Index("ix_saga_executions_parent", "parent_execution_id"),
    Index("ix_saga_executions_wake", "state", "wake_at"),
    # list by rollback status, in listing order. See migration 0006.
    Index("ix_saga_executions_rollback", "rollback_status", "created_at", "id"),
    Index("ix_saga_executions_deadline", "deadline_at"),
    # A key's queued runs in start order, for the run that ends and hands its slot on.
    Index("ix_saga_executions_flow", "saga_name", "flow_key", "state", "created_at", "id"),
)

#: Failed runs whose unwind never started, for the recovery sweep: on PostgreSQL and SQLite
#: an index of those runs alone (the planner cannot misjudge it: a NULL rollback status is
#: common among all runs and rare among failed ones); MySQL has no partial index and gets
#: the composite. See migration 0006.
UNWIND_OWED = "state = 'failed' AND rollback_status IS NULL"
Index(
    "ix_saga_executions_unwind_owed",
    executions.c.state,
    executions.c.rollback_status,
    postgresql_where=text(UNWIND_OWED),
    sqlite_where=text(UNWIND_OWED),
)
# The planner's view of (state, rollback_status) together; see migration 0006.
event.listen(
    executions,
    "after_create",
    DDL(  # type: ignore[no-untyped-call]
        "CREATE STATISTICS st_saga_executions_state_rollback (mcv) "
        "ON state, rollback_status FROM saga_executions"
    ).execute_if(dialect="postgresql"),
)

step_records = Table(
    "saga_steps",
    metadata,
    Column("id", RecordId, primary_key=True, autoincrement=True),
    _run_id(nullable=False),
    Column("name", String(200), nullable=False),
    Column("node", Integer, nullable=False),
    Column("sub", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("idempotency_key", String(400), nullable=False),
    Column("compensatable", Boolean, nullable=False),
    Column("result", Blob),
    Column("error", Text),
    Column("lease_expires_at", Timestamp),
    Column("started_at", Timestamp, nullable=False),
    Column("completed_at", Timestamp),
    Column("compensation_status", String(32)),
    Column("compensation_reason", Text),
    Column("compensated_at", Timestamp),
    Column("compensation_attempts", Integer, nullable=False, default=0),
    Column("compensation_lease_expires_at", Timestamp),
    Column("child_execution_id", String(64)),
    # The worker process holding the claim ("node/pid/task id"): a takeover asks it first.
    Column("holder", String(200)),
    Column("compensation_holder", String(200)),
    # The W3C traceparent of the span of the forward attempt that last claimed the step,
    # written with its claim: its reversal's span links to it (celery_saga.tracing).
    Column("trace_context", String(64)),
    UniqueConstraint("execution_id", "name", name="uq_saga_steps_execution_name"),
)


def _one_per_run_and(name: str, key: Column[Any], *rest: Any) -> Table:
    """A table of at most one row per run and ``key``: the primary key is the guarantee."""
    return Table(
        name,
        metadata,
        _run_id(nullable=False),
        key,
        *rest,
        PrimaryKeyConstraint("execution_id", key.name, name=f"pk_{name}"),
    )


decisions = _one_per_run_and(
    "saga_decisions",
    Column("key", String(200), nullable=False),
    Column("value", Blob),
    Column("created_at", Timestamp, nullable=False),
)

# First writer wins per (execution, event): the key is the guarantee (13).
signals = _one_per_run_and(
    "saga_signals",
    Column("event", String(200), nullable=False),
    Column("payload", Blob),
    Column("received_at", Timestamp, nullable=False),
)


history = Table(
    "saga_history",
    metadata,
    Column("id", RecordId, primary_key=True, autoincrement=True),
    _run_id(nullable=False),
    Column("at", Timestamp, nullable=False),
    Column("kind", String(40), nullable=False),
    Column("step", String(200)),
    Column("attempt", Integer),
    Column("holder", String(200)),
    Column("actor", String(200)),
    Column("detail", Text),
    Column("data", Blob),
    # A step attempt's row: when the attempt began (``at`` is when it ended).
    Column("started_at", Timestamp),
    Index("ix_saga_history_execution", "execution_id", "id"),
)

#: A run's searchable labels (``start(..., labels=...)``), written once with the run. The
#: index leads with (key, value): a filter on a label pages through its runs by id.
run_labels = _one_per_run_and(
    "saga_run_labels",
    Column("key", String(100), nullable=False),
    Column("value", String(200), nullable=False),
    Index("ix_saga_run_labels_key_value", "key", "value", "execution_id"),
)


def _archive_of(table: Table, primary_key: tuple[str, ...], *extra: Column[Any]) -> Table:
    """A copy of ``table``'s columns without foreign keys or defaults, for archived runs."""
    columns = [
        Column(c.name, c.type, nullable=bool(c.nullable), autoincrement=False)
        for c in table.columns
    ]
    return Table(
        f"{table.name}_archive",
        metadata,
        *columns,
        *extra,
        PrimaryKeyConstraint(*primary_key, name=f"pk_{table.name}_archive"),
    )


executions_archive = _archive_of(
    executions, ("id",), Column("archived_at", Timestamp, nullable=False)
)
# (execution, name), not id: SQLite may hand a deleted row's id to a new one.
step_records_archive = _archive_of(step_records, ("execution_id", "name"))
signals_archive = _archive_of(signals, ("execution_id", "event"))
decisions_archive = _archive_of(decisions, ("execution_id", "key"))
history_archive = _archive_of(history, ("execution_id", "id"))
run_labels_archive = _archive_of(run_labels, ("execution_id", "key"))

#: Live table -> its archive, children after their execution.
ARCHIVES = (
    (executions, executions_archive),
    (step_records, step_records_archive),
    (signals, signals_archive),
    (decisions, decisions_archive),
    (history, history_archive),
    (run_labels, run_labels_archive),
)

#: Where each version of a saga is deployed: one row per (saga, hash, process that
#: registered it), written when a worker starts (``celery saga versions`` reads it).
versions = Table(
    "saga_versions",
    metadata,
    Column("saga_name", String(200), nullable=False),
    Column("definition_hash", String(64), nullable=False),
    Column("label", String(200)),
    Column("seen_by", String(200), nullable=False),
    Column("first_seen", Timestamp, nullable=False),
    Column("last_seen", Timestamp, nullable=False),
    PrimaryKeyConstraint("saga_name", "definition_hash", "seen_by", name="pk_saga_versions"),
)

#: A run whose message a worker without its version handed back: it waits for a worker that
#: has it, as long as the run has not moved since (``handed_back_at`` >= its updated_at).
version_waits = Table(
    "saga_version_waits",
    metadata,
    _run_id(primary_key=True),
    Column("definition_hash", String(64), nullable=False),
    Column("handed_back_by", String(200), nullable=False),
    Column("handed_back_at", Timestamp, nullable=False),
    Column("times", Integer, nullable=False),
)

#: What each version's structural hash covers, as the JSON text it hashes (one row per
#: saga and hash, written once): ``upgrade`` and ``saga versions check`` judge a run
#: against another version with it, without the run's own version in the process.
version_shapes = Table(
    "saga_version_shapes",
    metadata,
    Column("saga_name", String(200), nullable=False),
    Column("definition_hash", String(64), nullable=False),
    Column("label", String(200)),
    Column("shape", ShapeText, nullable=False),
    Column("recorded_at", Timestamp, nullable=False),
    PrimaryKeyConstraint("saga_name", "definition_hash", name="pk_saga_version_shapes"),
)

#: A step (``step_name``), or a whole saga (``step_name`` ''), paused by an operator: a run
#: that reaches it is held at its door. The step claim's statement refuses while a row here
#: matches (``prepared.not_paused``): a tiny table, read by its primary key.
pauses = Table(
    "saga_pauses",
    metadata,
    Column("saga_name", String(200), nullable=False),
    Column("step_name", String(200), nullable=False),
    Column("reason", Text, nullable=False),
    Column("actor", String(200)),
    Column("paused_at", Timestamp, nullable=False),
    PrimaryKeyConstraint("saga_name", "step_name", name="pk_saga_pauses"),
)

#: A run held at the door of a paused step, until ``unpause`` releases it: written with
#: the hold, deleted with the release (both conditional), so a release interrupted and run
#: again never releases a run twice. ``pause_step`` names the pause that held it.
paused_runs = Table(
    "saga_paused_runs",
    metadata,
    _run_id(primary_key=True),
    Column("saga_name", String(200), nullable=False),
    Column("pause_step", String(200), nullable=False),
    Column("step_name", String(200), nullable=False),
    Column("held_at", Timestamp, nullable=False),
    Index("ix_saga_paused_runs_pause", "saga_name", "pause_step", "held_at"),
)

#: A move applied to every run a filter selects (``engine.bulk``): what it does, who asked
#: and why, and how far it got (``cursor``: the last run it went past), so an interrupted
#: operation resumes where it stopped (``--resume``); ``holder``: the process carrying it
#: out, until ``lease_until`` unless it renews (``decisions.bulk_lease``).
bulk_operations = Table(
    "saga_bulk_operations",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("move", String(40), nullable=False),
    Column("filter", Text, nullable=False),
    Column("options", Text),
    Column("actor", String(200)),
    Column("reason", Text),
    Column("cursor", String(200)),
    Column("acted", Integer, nullable=False),
    Column("refused", Integer, nullable=False),
    Column("created_at", Timestamp, nullable=False),
    Column("updated_at", Timestamp, nullable=False),
    Column("finished_at", Timestamp),
    Column("holder", String(200)),
    Column("lease_until", Timestamp),
)

#: Flow control (guarantee 37): how many runs of a saga's key hold a slot (``live``), and
#: the limit the last admission applied. A run takes a slot when it is admitted and gives
#: it back (or hands it to the key's oldest queued run) in the transaction that ends it.
flow_slots = Table(
    "saga_flow_slots",
    metadata,
    Column("saga_name", String(200), nullable=False),
    Column("flow_key", String(200), nullable=False),
    Column("live", Integer, nullable=False),
    Column("run_limit", Integer, nullable=False),
    PrimaryKeyConstraint("saga_name", "flow_key", name="pk_saga_flow_slots"),
)

#: Step flow control (``step(concurrency=, rate=)``): one row per task scope and key, the
#: lock every admission of the key takes, and the next free turn of a rate.
step_keys = Table(
    "saga_step_keys",
    metadata,
    Column("scope", String(200), nullable=False),
    Column("flow_key", String(200), nullable=False),
    Column("next_turn_at", Timestamp),
    Column("last_start_at", Timestamp),
    PrimaryKeyConstraint("scope", "flow_key", name="pk_saga_step_keys"),
)

#: A step of a run at a limited door: waiting for a slot (``granted_at`` NULL), holding one
#: (granted: its body runs or is about to), or booked for a rate's turn (``turn_at``); what
#: its message was, so a slot that frees can send it again.
step_waits = Table(
    "saga_step_waits",
    metadata,
    _run_id(nullable=False),
    Column("record", String(200), nullable=False),
    Column("saga_name", String(200), nullable=False),
    Column("definition_hash", String(64), nullable=False),
    Column("scope", String(200), nullable=False),
    Column("flow_key", String(200), nullable=False),
    Column("node", Integer, nullable=False),
    Column("sub", Integer, nullable=False),
    Column("member", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("waiting_since", Timestamp, nullable=False),
    Column("granted_at", Timestamp),
    Column("turn_at", Timestamp),
    PrimaryKeyConstraint("execution_id", "record", name="pk_saga_step_waits"),
    Index("ix_saga_step_waits_key", "scope", "flow_key", "waiting_since"),
)
