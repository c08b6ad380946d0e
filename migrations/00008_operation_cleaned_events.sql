-- +goose Up

-- What an operation keeps of its events once the outbox lets go of them.
-- Published events leave the outbox after QUILL_OUTBOX_RETENTION (168h),
-- while the key is remembered for QUILL_KEY_RETENTION (720h); the lookup
-- (GET /v1/operations/{key}) would then answer "effects": [] for an
-- operation that had effects. So when a published event of an operation is
-- deleted from the outbox, its id, type, publication time and stream
-- sequence move into the operation record, which lives as long as the key:
-- a JSON array of {"seq", "id", "type", "published_at", "stream_seq"}, in
-- outbox order, NULL while nothing was moved. The lookup reads the outbox
-- and this column together (decision 0048).
--
-- A trigger does the move, not the cleanup's statement, for the reason the
-- outbox_pending triggers give (00007): whatever deletes outbox rows — the
-- cleanup of this or an older relay, an operator's DELETE — the operation
-- keeps what its lookup shows. It is per statement with a transition table,
-- so a cleanup batch of 500 events pays for one trigger call. The write
-- path is untouched: it costs nothing until the cleanup runs.
--
-- Only published events move: an event deleted before it was published (by
-- hand; the cleanup never does that) never reached the stream, and showing
-- it as pending for good would say it still may. Events of an earlier
-- execution under the key (before it was forgotten and executed again) are
-- older than the record and match nothing. A record already forgotten
-- (QUILL_KEY_RETENTION shorter than QUILL_OUTBOX_RETENTION) matches
-- nothing either: its lookup answers 404 anyway.
ALTER TABLE operations ADD COLUMN cleaned_events jsonb;

-- +goose StatementBegin
CREATE FUNCTION operations_keep_cleaned_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE operations o
    SET cleaned_events = coalesce(o.cleaned_events, '[]'::jsonb) || d.events
    FROM (
        SELECT e.tenant, e.operation_key, min(e.created_at) AS first_created,
            jsonb_agg(jsonb_build_object('seq', e.seq, 'id', e.id, 'type', e.type,
                'published_at', e.published_at, 'stream_seq', e.stream_seq) ORDER BY e.seq) AS events
        FROM outbox_old e
        JOIN operations r ON r.tenant = e.tenant AND r.key = e.operation_key AND e.created_at >= r.created_at
        WHERE e.operation_key IS NOT NULL AND e.published_at IS NOT NULL
        GROUP BY e.tenant, e.operation_key
    ) d
    -- created_at again here: it is re-checked on the row actually updated,
    -- should the key be executed again while this statement waits for it.
    WHERE o.tenant = d.tenant AND o.key = d.operation_key AND o.created_at <= d.first_created;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- Pinned to the migration's schema, as the outbox_pending functions are
-- (00007): a session with another search_path must still find operations.
-- And, as theirs, its join must probe the operations' primary key: a plan
-- made while the table was small (plpgsql keeps it for the session) would
-- scan every operation of 30 days on each cleanup batch.
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION operations_keep_cleaned_events() SET search_path = %I', current_schema());
    ALTER FUNCTION operations_keep_cleaned_events() SET enable_seqscan = off;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER operations_keep_cleaned_events AFTER DELETE ON outbox_events
    REFERENCING OLD TABLE AS outbox_old FOR EACH STATEMENT EXECUTE FUNCTION operations_keep_cleaned_events();

-- +goose Down
DROP TRIGGER operations_keep_cleaned_events ON outbox_events;
DROP FUNCTION operations_keep_cleaned_events();
ALTER TABLE operations DROP COLUMN cleaned_events;
