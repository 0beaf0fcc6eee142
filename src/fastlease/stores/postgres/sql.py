"""PostgreSQL: the tables (their DDL and checks), every statement the store sends, and what each
SQLSTATE means to it.

One SQL table per lock table name, named exactly as the lock table (quoted, so case and ``.``/``-``
are kept), created only by ``PostgresClient.create_lock_table``: like DynamoDB, and unlike the embedded
SQLite store, lock operations never create tables (a server's schema is a deployment's business).

Row locks, and why the takeover takes the strongest one: ``check_in`` locks the lease row ``FOR KEY
SHARE`` in the caller's transaction. That mode conflicts only with ``FOR UPDATE``, which the takeover
(``REPLACE_IF``) and the release (``FREE``) take before they write, so neither a takeover nor a
release (after which anyone may acquire) commits while a checked-in transaction is open. Renewals are a
plain ``UPDATE`` (``FOR NO KEY UPDATE``), which ``FOR KEY SHARE`` lets through, so a long transaction
does not stop the holder's renewals.


Table names follow the library's rule (3-255 of ``A-Z a-z 0-9 _ . -``) and PostgreSQL's 63-byte limit
on identifiers; SQL cannot take identifiers as parameters, so a name is validated, then double-quoted,
"""

from __future__ import annotations

import hashlib
import re

from ..base import check_table

TYPE_CHECKING = False  # typing is not imported at run time
if TYPE_CHECKING:
    from typing import Sequence

#: PostgreSQL truncates longer identifiers (NAMEDATALEN - 1): two long names would silently be one table.
MAX_IDENTIFIER_BYTES = 63

#: One lock table. ``owner`` NULL means free: the row stays only to keep its ``fence`` counter.
LOCK_TABLE_SCHEMA = """CREATE TABLE IF NOT EXISTS {name} (
    key      text PRIMARY KEY,
    owner    text,
    version  text,
    lease_ms bigint,
    protocol integer,
    waiting  boolean NOT NULL DEFAULT false,
    fence    bigint NOT NULL DEFAULT 0
)"""
#: The columns (name, type) a lock table must have: a rerun of create_lock_table checks them.
LOCK_COLUMNS = (("key", "text"), ("owner", "text"), ("version", "text"), ("lease_ms", "bigint"),
                ("protocol", "integer"), ("waiting", "boolean"), ("fence", "bigint"))

#: One idempotency record table: a row per key, written only under the key's lease.
RECORD_TABLE_SCHEMA = """CREATE TABLE IF NOT EXISTS {name} (
    key           text PRIMARY KEY,
    state         text NOT NULL,
    fingerprint   text NOT NULL,
    result        bytea NOT NULL,
    expires_at_ms bigint NOT NULL,
    owner         text NOT NULL
)"""
RECORD_COLUMNS = (("key", "text"), ("state", "text"), ("fingerprint", "text"), ("result", "bytea"),
                  ("expires_at_ms", "bigint"), ("owner", "text"))
#: The purge of expired records reads this index, not the whole table. Its name is derived from the
#: table's (a digest, so that it fits 63 bytes whatever the table's name).
RECORD_EXPIRY_INDEX = """CREATE INDEX IF NOT EXISTS {index} ON {name} (expires_at_ms) WHERE expires_at_ms > 0"""

#: Acquire: insert the row, or revive a freed one (its fence incremented); never touch a held row.
#: RETURNING gives the new fencing token, so the acquisition is one round trip.
PUT_IF_ABSENT = """INSERT INTO {name} AS held (key, owner, version, lease_ms, protocol, waiting, fence)
VALUES ($1, $2, $3, $4, 1, false, 1)
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, version = excluded.version,
    lease_ms = excluded.lease_ms, protocol = 1, waiting = false, fence = held.fence + 1
WHERE held.owner IS NULL
RETURNING fence"""
#: Takeover: only on exactly the observed (owner, version). It locks the row FOR UPDATE first: the one
#: mode that waits for a check_in's FOR KEY SHARE, so no takeover commits inside a checked-in transaction.
REPLACE_IF = """WITH observed AS (
    SELECT key FROM {name} WHERE key = $4 AND owner = $5 AND version = $6 FOR UPDATE
)
UPDATE {name} SET owner = $1, version = $2, lease_ms = $3, protocol = 1, waiting = false, fence = fence + 1
WHERE key = $4 AND owner = $5 AND version = $6 AND EXISTS (SELECT 1 FROM observed)
RETURNING fence"""
#: Renew: a new version, and the lease's own lease_ms ($5; 0: unchanged), which the first renewal of a
#: lease handed over on release (FREE_IN_LINE, written with the handover's shorter span) writes back.
UPDATE_VERSION_IF = """UPDATE {name} SET version = $1, lease_ms = coalesce(nullif($5::bigint, 0), lease_ms)
WHERE key = $2 AND owner = $3 AND version = $4"""
#: A contender's turn-taking hint, once per hold.
MARK_WAITING = """UPDATE {name} SET waiting = true
WHERE key = $1 AND owner = $2 AND version = $3 AND NOT waiting"""
#: Release: free the row (the fence stays), returning the hint it had, and notify the table's release
#: channel with the key (delivered at commit, to the waiters of every client that listens: see
#: feed). The CTE reads the old hint under a FOR UPDATE lock, as a takeover does: a release
#: waits for a checked-in transaction to end, so that nobody acquires the freed row while that
#: transaction can still commit.
FREE = """WITH held AS (
    SELECT waiting FROM {name} WHERE key = $1 AND owner = $2 FOR UPDATE
), freed AS (
    UPDATE {name} SET owner = NULL, version = NULL, waiting = false
    WHERE key = $1 AND owner = $2 AND EXISTS (SELECT 1 FROM held)
    RETURNING (SELECT waiting FROM held) AS waiting
)
SELECT waiting, pg_notify($3, $1) FROM freed"""
#: The line of waiters of a lock table's keys (docs/protocol.md, "Waiting, polling and handoff"): one
#: row per waiting acquisition, ordered by arrival on the server's clock; each read of the waiter pushes
#: its ``alive_until`` LINE_ALIVE_MS ahead, and a waiter past it has lost its place. Made with the lock
#: table, under a name derived from the lock table's (``line_table``). Only turns rest on it, never
#: ownership: the acquisition's conditions are those of PUT_IF_ABSENT.
LINE_TABLE_SCHEMA = """CREATE TABLE IF NOT EXISTS {line} (
    key           text NOT NULL,
    waiter        text NOT NULL,
    channel       text NOT NULL,
    arrived       timestamptz NOT NULL,
    alive_until   timestamptz NOT NULL,
    offer_owner   text,
    offer_version text,
    offer_px_ms   bigint,
    offered_at    timestamptz,
    PRIMARY KEY (key, waiter)
)"""
#: A lock's waiter's offer to take the lease over on its release (docs/protocol.md, "The handover on
#: PostgreSQL"): the owner and version the release writes the lease in, with ``offer_px_ms`` as its
#: lease_ms, if the offer was made (``offered_at``, the server's clock) no longer than a third of that ago.
#: A line table made by an earlier version gains these columns when create_lock_table runs again; until
#: then the store uses the statements without offers (``..._WITHOUT_OFFERS``) on it.
OFFER_COLUMNS = (("offer_owner", "text"), ("offer_version", "text"), ("offer_px_ms", "bigint"),
                 ("offered_at", "timestamp with time zone"))  # (as the catalog names them: see COLUMNS)
LINE_OFFER_COLUMNS = "ALTER TABLE {line} " + ", ".join(f"ADD COLUMN IF NOT EXISTS {name} {kind}"
                                                       for name, kind in OFFER_COLUMNS)
#: What an operator listing the tables reads about a line's (its name says nothing of its lock table's).
LINE_TABLE_COMMENT = """COMMENT ON TABLE {line} IS 'fastlease: the line of waiters of lock table {name}'"""
#: A waiter's read: waiter $2 takes a place at the end of the line of key $5 (key $1's own, or its
#: semaphore's) or keeps its own for $3 ms more, with $4, the channel that tells its client of its turn
#: (feed.turn_channel), and its offer ($6-$8: owner, version and the handover's lease_ms; NULLs: none);
#: waiters in that line dead for as long again are dropped. A read that finds the lease already handed
#: over to its offer's owner takes no new place. The answer is key $1's held row (NULLs when the key is
#: free) and ``turn``: the key is free and no live waiter is ahead of $2.
READ_IN_LINE = """WITH kept AS (
    INSERT INTO {line} AS place (key, waiter, channel, arrived, alive_until, offer_owner, offer_version,
        offer_px_ms, offered_at)
    SELECT $5::text, $2::text, $4::text, clock_timestamp(), clock_timestamp() + $3::bigint * interval '1 millisecond',
        $6::text, $7::text, $8::bigint, clock_timestamp()
    WHERE $6::text IS NULL OR NOT EXISTS (SELECT 1 FROM {name} WHERE key = $5 AND owner = $6::text)
    ON CONFLICT (key, waiter) DO UPDATE SET alive_until = excluded.alive_until, offer_owner = excluded.offer_owner,
        offer_version = excluded.offer_version, offer_px_ms = excluded.offer_px_ms, offered_at = excluded.offered_at
    RETURNING 1
), dropped AS (
    DELETE FROM {line} WHERE key = $5 AND waiter <> $2
    AND alive_until < clock_timestamp() - $3::bigint * interval '1 millisecond'
)
SELECT held.owner, held.version, held.lease_ms, held.protocol, held.waiting, held.fence,
    held.key IS NULL AND NOT EXISTS (
        SELECT 1 FROM {line} other WHERE other.key = $5 AND other.waiter <> $2
        AND other.alive_until > clock_timestamp()
        AND (other.arrived, other.waiter) < (SELECT coalesce(max(mine.arrived), 'infinity'), $2::text
                                            FROM {line} mine WHERE mine.key = $5 AND mine.waiter = $2)
    ) AS turn
FROM (SELECT 1) AS one LEFT JOIN {name} AS held ON held.key = $1 AND held.owner IS NOT NULL"""
#: The same, on a line table made by an earlier version, without offers ($6-$8 are not sent).
READ_IN_LINE_WITHOUT_OFFERS = """WITH kept AS (
    INSERT INTO {line} AS place (key, waiter, channel, arrived, alive_until)
    VALUES ($5, $2, $4, clock_timestamp(), clock_timestamp() + $3::bigint * interval '1 millisecond')
    ON CONFLICT (key, waiter) DO UPDATE SET alive_until = excluded.alive_until
    RETURNING 1
), dropped AS (
""" + READ_IN_LINE[READ_IN_LINE.index("    DELETE FROM {line} WHERE key = $5 AND waiter <> $2"):]
#: A waiter's read of every slot of a semaphore ($1, an array of keys), in one statement
#: (READ_ALL_IN_LINE): READ_IN_LINE's place kept in the line of key $5 (the semaphore's), then this, one
#: row per key, in order: the held row (NULLs when free) and ``turn``, the same in every row: no live
#: waiter is ahead of $2.
EVERY_SLOT_IN_LINE = """SELECT held.owner, held.version, held.lease_ms, held.protocol, held.waiting, held.fence,
    NOT EXISTS (
        SELECT 1 FROM {line} other WHERE other.key = $5 AND other.waiter <> $2
        AND other.alive_until > clock_timestamp()
        AND (other.arrived, other.waiter) < (SELECT coalesce(max(mine.arrived), 'infinity'), $2::text
                                            FROM {line} mine WHERE mine.key = $5 AND mine.waiter = $2)
    ) AS turn
FROM unnest($1::text[]) WITH ORDINALITY AS slot (key, n)
LEFT JOIN {name} AS held ON held.key = slot.key AND held.owner IS NOT NULL ORDER BY slot.n"""
# (A semaphore's waiter makes no offer: the statement without offers serves every line table.)
READ_ALL_IN_LINE = (READ_IN_LINE_WITHOUT_OFFERS[:READ_IN_LINE_WITHOUT_OFFERS.index("SELECT held.owner")]
                    + EVERY_SLOT_IN_LINE)
#: The same read where the table has no line: the rows alone.
READ_ALL = """SELECT held.owner, held.version, held.lease_ms, held.protocol, held.waiting, held.fence
FROM unnest($1::text[]) WITH ORDINALITY AS slot (key, n)
LEFT JOIN {name} AS held ON held.key = slot.key AND held.owner IS NOT NULL ORDER BY slot.n"""
#: Acquire in turn: as PUT_IF_ABSENT ($3-$5: owner, version, lease_ms), for waiter $2, and refused while
#: a live waiter is ahead of $2 in the line of key $6 (key $1's own, or its semaphore's; anyone live, if
#: $2 has no place in it). Applied, it takes $2 out of the line in the same statement.
PUT_IN_TURN = """WITH put AS (
    INSERT INTO {name} AS held (key, owner, version, lease_ms, protocol, waiting, fence)
    SELECT $1::text, $3::text, $4::text, $5::bigint, 1, false, 1 WHERE NOT EXISTS (
        SELECT 1 FROM {line} other WHERE other.key = $6 AND other.waiter <> $2
        AND other.alive_until > clock_timestamp()
        AND (other.arrived, other.waiter) < (SELECT coalesce(max(mine.arrived), 'infinity'), $2::text
                                            FROM {line} mine WHERE mine.key = $6 AND mine.waiter = $2)
    )
    ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, version = excluded.version,
        lease_ms = excluded.lease_ms, protocol = 1, waiting = false, fence = held.fence + 1
    WHERE held.owner IS NULL
    RETURNING fence
), left_line AS (
    DELETE FROM {line} WHERE key = $6 AND waiter = $2 AND EXISTS (SELECT 1 FROM put)
)
SELECT fence FROM put"""
#: What a put in turn on a semaphore's slot adds (PUT_IN_TURN_PASSING): applied, it announces the turn of
#: the next live waiter of the semaphore's line ($6), as another slot may be free too; its id and a space,
#: with no slot named (the waiter looks at every slot).
PASS_TURN_ON = """
), passed AS (
    SELECT pg_notify(head.channel, head.waiter || ' ') FROM (
        SELECT waiter, channel FROM {line} WHERE key = $6 AND waiter <> $2 AND alive_until > clock_timestamp()
        ORDER BY arrived, waiter LIMIT 1
    ) AS head WHERE EXISTS (SELECT 1 FROM put)
)
SELECT fence FROM put LEFT JOIN passed ON true"""
PUT_IN_TURN_PASSING = PUT_IN_TURN.replace("\n)\nSELECT fence FROM put", PASS_TURN_ON, 1)
#: Release, where the table has a line: as FREE, but the notification goes to the first live waiter in
#: the line of key $4 (key $1's own, or its semaphore's) alone, on the channel of its client with its id
#: (for a semaphore's line, followed by a space and the key released, which the waiter then tries first);
#: with nobody live in line, to every waiter, on the table's release channel ($3) with the key. Where
#: that waiter, in a lock's line, left an offer no older than a third of its span, the release hands the
#: lease over in the same statement: the row is written in the offer's owner and version, with the
#: offer's span as its lease_ms and a new fence, the waiter leaves the line, and its id is followed by
#: " =<version> <fence>". A place left by the releaser itself, as a waiter that was handed the lease (its
#: read in line ran beside that handover, and kept a place the handover had just taken away), is
#: deleted, never the head. A third column says whether the lease was handed over.
FREE_IN_LINE = """WITH held AS (
    SELECT waiting FROM {name} WHERE key = $1 AND owner = $2 FOR UPDATE
), head AS (
    SELECT waiter, channel, offer_owner, offer_version, offer_px_ms, $4 = $1 AND offer_owner IS NOT NULL
        AND offered_at >= clock_timestamp() - offer_px_ms / 3 * interval '1 millisecond' AS hands
    FROM {line} WHERE key = $4 AND alive_until > clock_timestamp() AND offer_owner IS DISTINCT FROM $2
    ORDER BY arrived, waiter LIMIT 1
), handed AS (
    SELECT offer_owner, offer_version, offer_px_ms FROM head WHERE hands
), freed AS (
    UPDATE {name} SET owner = (SELECT offer_owner FROM handed), version = (SELECT offer_version FROM handed),
        lease_ms = coalesce((SELECT offer_px_ms FROM handed), lease_ms),
        fence = fence + (SELECT count(*) FROM handed), waiting = false
    WHERE key = $1 AND owner = $2 AND EXISTS (SELECT 1 FROM held)
    RETURNING (SELECT waiting FROM held) AS waiting, fence, EXISTS (SELECT 1 FROM handed) AS hands
), taken AS (
    DELETE FROM {line} WHERE key = $4 AND EXISTS (SELECT 1 FROM freed)
    AND (offer_owner = $2 OR waiter = (SELECT waiter FROM head WHERE hands))
)
SELECT freed.waiting, CASE WHEN head.waiter IS NULL THEN pg_notify($3, $1)
    WHEN freed.hands THEN pg_notify(head.channel, head.waiter || ' =' || head.offer_version || ' ' || freed.fence)
    WHEN $4 = $1 THEN pg_notify(head.channel, head.waiter) ELSE pg_notify(head.channel, head.waiter || ' ' || $1) END,
    freed.hands
FROM freed LEFT JOIN head ON true"""
#: The same, on a line table made by an earlier version: no handover.
FREE_IN_LINE_WITHOUT_OFFERS = """WITH held AS (
    SELECT waiting FROM {name} WHERE key = $1 AND owner = $2 FOR UPDATE
), freed AS (
    UPDATE {name} SET owner = NULL, version = NULL, waiting = false
    WHERE key = $1 AND owner = $2 AND EXISTS (SELECT 1 FROM held)
    RETURNING (SELECT waiting FROM held) AS waiting
), head AS (
    SELECT waiter, channel FROM {line} WHERE key = $4 AND alive_until > clock_timestamp()
    ORDER BY arrived, waiter LIMIT 1
)
SELECT waiting, CASE WHEN head.waiter IS NULL THEN pg_notify($3, $1)
    WHEN $4 = $1 THEN pg_notify(head.channel, head.waiter) ELSE pg_notify(head.channel, head.waiter || ' ' || $1) END
FROM freed LEFT JOIN head ON true"""
#: Leave the line: waiter $2 gives up its place in the line of key $3 (key $1's own, or its semaphore's);
#: if it had the turn (key $1 free and no live waiter ahead of it), or a release had handed it the lease
#: meanwhile (held in its offer's owner, $4), which is freed, the next live waiter's turn is announced
#: on its client's channel.
LEAVE_LINE = """WITH gone AS (
    DELETE FROM {line} WHERE key = $3 AND waiter = $2 RETURNING arrived
), unhanded AS (
    UPDATE {name} SET owner = NULL, version = NULL, waiting = false WHERE key = $1 AND owner = $4::text
    RETURNING 1
), head AS (
    SELECT waiter, channel FROM {line} WHERE key = $3 AND waiter <> $2 AND alive_until > clock_timestamp()
    ORDER BY arrived, waiter LIMIT 1
)
SELECT pg_notify(head.channel, head.waiter) FROM head
WHERE EXISTS (SELECT 1 FROM unhanded) OR EXISTS (SELECT 1 FROM gone
    WHERE NOT EXISTS (SELECT 1 FROM {name} WHERE key = $1 AND owner IS NOT NULL)
    AND NOT EXISTS (SELECT 1 FROM {line} other WHERE other.key = $3 AND other.waiter <> $2
        AND other.alive_until > clock_timestamp() AND (other.arrived, other.waiter) < (gone.arrived, $2::text)))"""
READ = """SELECT owner, version, lease_ms, protocol, waiting, fence FROM {name}
WHERE key = $1 AND owner IS NOT NULL"""
INSPECT = """SELECT key, owner, version, lease_ms, protocol, waiting, fence FROM {name}
WHERE owner IS NOT NULL AND ($1::text IS NULL OR key = $1::text) ORDER BY key"""
#: check_in, on the caller's connection: lock our row in the caller's transaction (see the module's
#: docstring) and report whether it is still ours. Ownership is the owner id: it is new for every
#: acquisition and a takeover replaces it, while the version changes with our own renewals.
CHECK_IN = """SELECT 1 FROM {name} WHERE key = %s AND owner = %s FOR KEY SHARE"""
#: What makes the caller's connection "the same database" as the store's: the server instance (its
#: start time), the database, and the lock table the name resolves to there (so the search_path too).
IDENTITY = """SELECT pg_postmaster_start_time()::text, current_database(), to_regclass(%s)::oid::bigint"""
IDENTITY_BY_POSITION = IDENTITY.replace("%s", "$1")  # the store binds $1, psycopg %s

#: An idempotent call's completion, in one statement (so one atomic transaction): delete the lease row
#: (its fence counter with it: idempotency keys are mostly used once and nothing reads their tokens),
#: only while our owner holds it, then store the record (replacing any) and purge a few expired ones.
FINISH = """WITH released AS (
    DELETE FROM {locks} WHERE key = $1 AND owner = $2 RETURNING key
), stored AS (
    INSERT INTO {records} (key, state, fingerprint, result, expires_at_ms, owner)
    SELECT $1, $3, $4, $5, $6, $2 FROM released
    ON CONFLICT (key) DO UPDATE SET state = excluded.state, fingerprint = excluded.fingerprint,
        result = excluded.result, expires_at_ms = excluded.expires_at_ms, owner = excluded.owner
    RETURNING 1
), purged AS (
    DELETE FROM {records} WHERE key IN (
        SELECT key FROM {records} WHERE expires_at_ms > 0 AND expires_at_ms < $7 AND key <> $1
        AND EXISTS (SELECT 1 FROM released) LIMIT 16 FOR UPDATE SKIP LOCKED)
)
SELECT count(*) FROM stored"""
READ_RECORD = """SELECT state, fingerprint, result, expires_at_ms, owner FROM {name} WHERE key = $1"""
COLUMNS = """SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum"""

#: The connection's server-side bounds, set to the request's timeout (in ms) when it changes.
SET_TIMEOUTS = b"SELECT set_config('statement_timeout', $1, false), set_config('lock_timeout', $1, false)"
#: Statements prepared per connection at most (there are a handful per table).
MAX_PREPARED = 256

BYTEA_OID = 17
TEXT, _BINARY = 0, 1
#: Parameter formats: every parameter as text but the record's result (bytea, sent as raw bytes).
FINISH_FORMATS = [TEXT, TEXT, TEXT, TEXT, _BINARY, TEXT, TEXT]
FINISH_TYPES = [0, 0, 0, 0, BYTEA_OID, 0, 0]

#: SQLSTATE classes and codes by what waiting can do about them. A statement that failed with an error
#: was rolled back (autocommit: each statement is its own transaction), so only a lost connection
#: leaves a write's outcome unknown.
# Timeouts, lock waits, conflicts, and a prepared statement the server no longer has (prepared again next).
TRANSIENT_CODES = {"57014", "55P03", "40001", "40P01", "55006", "57P03", "26000"}
TRANSIENT_CLASSES = ("53", "58", "XX", "40")  # out of resources, system and internal errors, rollbacks
CONNECTION_CLASSES = ("08", "57P")  # the connection broke (or the server is going down) mid-request
HINTS = {
    "42P01": "the table does not exist: create it with client.create_lock_table(...) (or "
             "create_idempotency_table for records), or check the connection's search_path",
    "42501": "the role lacks a privilege on the table: see 'Roles and grants' in docs/operations.md",
    "25006": "the server is read-only (a standby?): point the DSN at the primary "
             "(target_session_attrs=read-write)",
    "42703": "the table's columns are not fastlease's: see the schema in docs/protocol.md",
}


#: What a concurrent ``CREATE ... IF NOT EXISTS`` of the same name that won the race leaves the others:
#: a duplicate catalog row (23505), relation (42P07) or row type (42710, "type ... already exists").
CREATION_RACE_CODES = ("23505", "42P07", "42710")

QUOTED_NAME = re.compile(r'"[A-Za-z0-9_.-]+"')  # the quoted table names in a statement, for messages


def sql_identifier(table: str) -> str:
    """``table`` as a quoted SQL identifier; rejects names outside the library's alphabet (so a name
    is valid on every store or on none) and names longer than PostgreSQL keeps (63 bytes)."""
    check_table(table)
    if len(table) > MAX_IDENTIFIER_BYTES:
        raise ValueError(
            f"PostgreSQL table names are at most {MAX_IDENTIFIER_BYTES} characters (longer ones are truncated, "
            f"so two names could be one table); got {len(table)}: {table!r:.80}"
        )
    return f'"{table}"'


def line_table(table: str) -> str:
    """The quoted name of lock table ``table``'s line of waiters: a digest of the name, so that it fits
    63 bytes whatever the name's length."""
    return '"fastlease_line_' + hashlib.sha1(table.encode()).hexdigest()[:24] + '"'


def expiry_index_name(table: str) -> str:
    return '"fastlease_expiry_' + hashlib.sha1(table.encode()).hexdigest()[:20] + '"'


def key_array(keys: Sequence[str]) -> bytes:
    """``keys`` as the text of a PostgreSQL array of text (for ``$1::text[]``): each element quoted, with
    its backslashes and double quotes escaped, so that no key can end or split an element."""
    return b"{" + b",".join(b'"' + key_bytes(key).replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'
                            for key in keys) + b"}"


def key_bytes(key: str) -> bytes:
    """The key as the UTF-8 bytes the server stores. PostgreSQL text cannot hold NUL: refused before
    any request, rather than stored as something else."""
    if "\x00" in key:
        raise ValueError(f"the PostgreSQL store cannot store a NUL character (\\x00) in a key; got {key!r:.80}")
    return key.encode()

