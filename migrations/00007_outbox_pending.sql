-- +goose Up

-- The relay's work queue, apart from the outbox rows: one narrow row per
-- committed, unpublished event (parked ones included). Before, the pending
-- set was three partial indexes on outbox_events over published_at, so
-- marking an event published rewrote the whole row and four index entries
-- (an update that changes an indexed column can never be HOT); the relay
-- spent most of its PostgreSQL time there. Now the mark deletes the queue
-- row and updates the outbox row in place (HOT: no indexed column changes,
-- and the fillfactor leaves room on the page), and the claim scans a table
-- of a few dozen bytes per row.
--
-- The queue is kept by triggers, not by the writers: whatever writes
-- outbox_events — the API, the worker, an operator's UPDATE, a test, an
-- older binary still running during a rolling upgrade — the queue holds
-- exactly the unpublished events, with parked mirroring parked_at. Every
-- trigger is per statement with a transition table, so a batch of 256 marks
-- pays for one trigger call, not 256. The functions are pinned to the
-- migration's schema, so a session with another search_path still finds
-- the queue.
CREATE TABLE outbox_pending (
    seq           bigint  PRIMARY KEY,
    aggregate_id  uuid    NOT NULL,
    parked        boolean NOT NULL DEFAULT false
);
-- "Is this the oldest pending event of its note?" is one probe here.
CREATE INDEX outbox_pending_note_idx ON outbox_pending (aggregate_id, seq);

-- +goose StatementBegin
CREATE FUNCTION outbox_pending_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_pending (seq, aggregate_id, parked)
    SELECT seq, aggregate_id, parked_at IS NOT NULL FROM outbox_new WHERE published_at IS NULL;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox_pending_on_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM outbox_pending p USING outbox_new n
    WHERE p.seq = n.seq AND n.published_at IS NOT NULL;
    -- Still (or again) unpublished: queued, with parked as parked_at says.
    -- The WHERE keeps the common case — a failed attempt counted — from
    -- writing anything.
    INSERT INTO outbox_pending AS p (seq, aggregate_id, parked)
    SELECT seq, aggregate_id, parked_at IS NOT NULL FROM outbox_new WHERE published_at IS NULL
    ON CONFLICT (seq) DO UPDATE SET parked = excluded.parked, aggregate_id = excluded.aggregate_id
    WHERE (p.parked, p.aggregate_id) IS DISTINCT FROM (excluded.parked, excluded.aggregate_id);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox_pending_on_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM outbox_pending p USING outbox_old o WHERE p.seq = o.seq;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION outbox_pending_on_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM outbox_pending;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- Pin the functions to the schema they were created in (SET search_path
-- FROM CURRENT would take the session's whole path, '"$user", public' by
-- default, and "$user" is resolved per caller).
-- +goose StatementBegin
DO $$
DECLARE f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['outbox_pending_on_insert', 'outbox_pending_on_update',
                             'outbox_pending_on_delete', 'outbox_pending_on_truncate'] LOOP
        EXECUTE format('ALTER FUNCTION %I() SET search_path = %I', f, current_schema());
    END LOOP;
    -- Their joins with the queue must probe its primary key: a plan made
    -- while the queue was small or empty (plpgsql keeps it for the session)
    -- would scan the whole queue on every mark once a backlog builds up.
    ALTER FUNCTION outbox_pending_on_update() SET enable_seqscan = off;
    ALTER FUNCTION outbox_pending_on_delete() SET enable_seqscan = off;
END
$$;
-- +goose StatementEnd

-- No event may be written between the copy below and the triggers taking
-- over (the migration is one transaction; the lock lasts until its end).
LOCK TABLE outbox_events IN SHARE ROW EXCLUSIVE MODE;

CREATE TRIGGER outbox_pending_insert AFTER INSERT ON outbox_events
    REFERENCING NEW TABLE AS outbox_new FOR EACH STATEMENT EXECUTE FUNCTION outbox_pending_on_insert();
CREATE TRIGGER outbox_pending_update AFTER UPDATE ON outbox_events
    REFERENCING NEW TABLE AS outbox_new FOR EACH STATEMENT EXECUTE FUNCTION outbox_pending_on_update();
CREATE TRIGGER outbox_pending_delete AFTER DELETE ON outbox_events
    REFERENCING OLD TABLE AS outbox_old FOR EACH STATEMENT EXECUTE FUNCTION outbox_pending_on_delete();
CREATE TRIGGER outbox_pending_truncate AFTER TRUNCATE ON outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_pending_on_truncate();

INSERT INTO outbox_pending (seq, aggregate_id, parked)
SELECT seq, aggregate_id, parked_at IS NOT NULL FROM outbox_events WHERE published_at IS NULL;

-- published_at is in no index any more, so the mark can be a HOT update.
-- Cleanup walks the primary key from the oldest event instead of an index
-- on published_at (see outbox.DeletePublished).
DROP INDEX outbox_events_unpublished_idx;
DROP INDEX outbox_events_claimable_idx;
DROP INDEX outbox_events_published_idx;

-- Room on each page for the one update every event gets (the mark), so
-- that it stays on its page (HOT) and writes no index entry. A mark updates
-- all the events of a page in one statement, so the page needs room for all
-- their new versions at once: with ~750-byte events, 70 % left room for
-- half of them (51 % of marks HOT in make bench-relay), 50 % for all (100 %).
-- Applies to pages filled from now on.
ALTER TABLE outbox_events SET (fillfactor = 50);

-- +goose Down
ALTER TABLE outbox_events RESET (fillfactor);
CREATE INDEX outbox_events_unpublished_idx ON outbox_events (aggregate_id, seq) WHERE published_at IS NULL;
CREATE INDEX outbox_events_claimable_idx ON outbox_events (seq) WHERE published_at IS NULL AND parked_at IS NULL;
CREATE INDEX outbox_events_published_idx ON outbox_events (published_at) WHERE published_at IS NOT NULL;
DROP TRIGGER outbox_pending_truncate ON outbox_events;
DROP TRIGGER outbox_pending_delete ON outbox_events;
DROP TRIGGER outbox_pending_update ON outbox_events;
DROP TRIGGER outbox_pending_insert ON outbox_events;
DROP FUNCTION outbox_pending_on_truncate();
DROP FUNCTION outbox_pending_on_delete();
DROP FUNCTION outbox_pending_on_update();
DROP FUNCTION outbox_pending_on_insert();
DROP TABLE outbox_pending;
