-- idemctl's PostgreSQL schema, as migrations. Each "-- migration N" section upgrades
-- version N-1 to N; provision() runs the sections above the database's version in one
-- transaction and records each in {schema_version}. {name} placeholders are identifiers,
-- quoted by the store (schema name and table prefix come from the URL).

-- migration 1: the idempotency keys
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.{schema_version} (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TYPE {schema}.{status} AS ENUM ('in_progress', 'completed', 'failed');
CREATE TABLE {schema}.{keys} (
    key              text PRIMARY KEY CHECK (octet_length(key) BETWEEN 1 AND 512),
    status           {schema}.{status} NOT NULL,
    fingerprint      text,
    owner            text,
    fencing_token    bigint NOT NULL,
    attempts         integer NOT NULL,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    completed_at     timestamptz,
    expires_at       timestamptz,
    result           jsonb,
    error            text,
    retriable        boolean NOT NULL DEFAULT false,
    -- Only an in-progress key has an owner: matching the owner is matching a live attempt.
    CONSTRAINT {keys_owner_in_progress} CHECK (owner IS NULL OR status = 'in_progress')
);
CREATE INDEX {keys_lease} ON {schema}.{keys} (lease_expires_at) WHERE status = 'in_progress';
CREATE INDEX {keys_expires} ON {schema}.{keys} (expires_at) WHERE expires_at IS NOT NULL;

-- migration 2: the transactional outbox (the columns of Debezium's outbox event router)
CREATE TABLE {schema}.{outbox} (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregatetype text NOT NULL,
    aggregateid   text NOT NULL,
    type          text NOT NULL,
    payload       jsonb,
    headers       jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz,
    attempts      integer NOT NULL DEFAULT 0,
    last_error    text
);
CREATE INDEX {outbox_unpublished} ON {schema}.{outbox} (created_at) WHERE published_at IS NULL;

-- migration 3: the outbox relay's order, back-off and the indexes of replay and purge.
-- seq orders rows as they were written (created_at is the transaction's start, shared by
-- all its rows); retry_at holds a failed row back until its next attempt.
ALTER TABLE {schema}.{outbox} ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY;
ALTER TABLE {schema}.{outbox} ADD COLUMN retry_at timestamptz;
DROP INDEX {schema}.{outbox_unpublished};
CREATE INDEX {outbox_unpublished} ON {schema}.{outbox} (seq) WHERE published_at IS NULL;
CREATE INDEX {outbox_created} ON {schema}.{outbox} (created_at);
CREATE INDEX {outbox_published} ON {schema}.{outbox} (published_at) WHERE published_at IS NOT NULL;

-- migration 4: the sequence guard ("apply if newer" per entity): the last sequence applied
-- to each entity and the key that applied it, and the attempt that holds the entity while
-- its handler runs (holder, holder_token: the key and its fencing token). Past expires_at
-- an entity is as if never seen, like a key; purge deletes it.
CREATE TABLE {schema}.{entities} (
    entity          text PRIMARY KEY CHECK (octet_length(entity) BETWEEN 1 AND 512),
    sequence        bigint,
    key             text,
    applied_at      timestamptz,
    holder          text,
    holder_token    bigint,
    lock_expires_at timestamptz,
    updated_at      timestamptz NOT NULL,
    expires_at      timestamptz
);
CREATE INDEX {entities_expires} ON {schema}.{entities} (expires_at) WHERE expires_at IS NOT NULL;

-- migration 5: the outbox relay's wake-up. Each statement that writes outbox rows notifies
-- the table's channel, 'idemctl_outbox_' || md5(schema || '.' || table) (PostgreSQL sends it
-- at the commit, once a transaction however many rows); a relay that LISTENs there takes
-- the rows at once instead of at its next poll.
CREATE FUNCTION {schema}.{outbox_notify}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_notify('idemctl_outbox_' || md5(TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME), ''); RETURN NULL; END $$;
CREATE TRIGGER {outbox_notify} AFTER INSERT ON {schema}.{outbox} FOR EACH STATEMENT EXECUTE FUNCTION {schema}.{outbox_notify}();
