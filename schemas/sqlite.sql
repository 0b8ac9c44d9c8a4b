-- idemctl's SQLite schema, version 2 (2 added idem_entities). Statements are separated by lines ending in ';'.
-- Times are integer milliseconds since the Unix epoch, UTC.
CREATE TABLE IF NOT EXISTS idem_keys (
    key              TEXT PRIMARY KEY,
    status           TEXT NOT NULL CHECK (status IN ('in_progress', 'completed', 'failed')),
    fingerprint      TEXT,
    owner            TEXT,
    fencing_token    INTEGER NOT NULL,
    attempts         INTEGER NOT NULL,
    lease_expires_at INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    completed_at     INTEGER,
    expires_at       INTEGER,
    result           TEXT,
    error            TEXT,
    retriable        INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_keys_lease ON idem_keys (lease_expires_at) WHERE status = 'in_progress';
CREATE INDEX IF NOT EXISTS idem_keys_expires ON idem_keys (expires_at) WHERE expires_at IS NOT NULL;
-- The sequence guard: per entity, the last sequence applied and the attempt holding it.
CREATE TABLE IF NOT EXISTS idem_entities (
    entity           TEXT PRIMARY KEY,
    sequence         INTEGER,
    key              TEXT,
    applied_at       INTEGER,
    holder           TEXT,
    holder_token     INTEGER,
    lock_expires_at  INTEGER,
    updated_at       INTEGER NOT NULL,
    expires_at       INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_entities_expires ON idem_entities (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS idem_meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
INSERT OR REPLACE INTO idem_meta (name, value) VALUES ('schema_version', '2');
