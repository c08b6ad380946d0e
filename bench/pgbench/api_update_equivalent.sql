-- Every statement one API note update sends (PATCH /v1/notes/{id} with
-- If-Match, issue 26), in the round trips it sends them in — PostgreSQL's
-- share of an update without Go, HTTP or JSON. Needs pgbench -M extended or
-- prepared (pipelines), and the notes of api_update_seed.sql: client
-- :client_id updates its own note, as each loadgen client does, so no two
-- clients wait for one row lock.
--
-- The API's update is two round trips (internal/notes planUpdate over
-- db.Pipeline; internal/notes' TestEveryWriteIsOneClaimStatement counts
-- them):
--   1. one pipelined batch: BEGIN, the transaction's lock_timeout and the
--      lock read — the live note joined to its attachment, FOR UPDATE OF n;
--      db.Pipeline.QueryRow queues the read behind BEGIN and waits for it,
--      as the API needs the version and fields before it can plan (412 or
--      not, what changed, the event's data, the recorded answer);
--   2. one pipelined batch: the claim statement (idempotency.NewClaimWrite
--      (outbox.EventInsert): advisory lock, record read, the record's insert
--      and the note.updated event's, each guarded), the note's UPDATE
--      guarded by the claim's transaction-local flag, COMMIT.
-- (Until 2026-12-02 the API sent 1 in two round trips, BEGIN apart from the
-- read; this script followed it then.)
--
-- What differs from the API, as pgbench allows:
--   - the values are computed here in SQL (md5, rpad), where the API binds
--     them; they are the sizes the API writes (measured on its rows: title
--     ~34 B, body ~224 B, event payload 688 B, recorded answer 442 B, four
--     field hashes); pgbench binds its variables as text, so the claim's
--     parameters keep their casts as the API's do;
--   - the advisory lock id is the random :r (the API's is a hash of tenant
--     and key), the event id gen_random_uuid() (the API derives it from
--     note, version and key), created_at/completed_at now();
--   - pgbench cannot read a result inside a pipeline (\gset is refused
--     there), so the lock read leaves the next version in a transaction-
--     local setting (set_config('bench.next', ...)) and batch 2 reads it
--     with current_setting where the API binds the version it computed; the
--     API reads the whole row to render the answer, pgbench discards it;
--   - the relays' NOTIFY (after the commit, coalesced) and the token lookup
--     (cached) are not part of the API's transaction, so not here either.
\set r random(1, 9000000000000000000)
\startpipeline
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT set_config('lock_timeout', '3000', true);
SELECT n.id, n.tenant, n.title, n.body, n.created_at, n.version, coalesce(n.updated_at, n.created_at),
       a.id, a.filename, a.content_type, a.size, a.sha256, a.status, a.result, a.reason, a.processed_at,
       set_config('bench.next', (n.version + 1)::text, true)
FROM bench_raw.notes n LEFT JOIN bench_raw.attachments a ON a.note_id = n.id
WHERE n.tenant = 'bench' AND n.id = md5('pgb-note-' || :client_id::text)::uuid AND n.deleted_at IS NULL
FOR UPDATE OF n;
\endpipeline
\startpipeline
WITH lk AS (SELECT pg_try_advisory_xact_lock(:r) AS locked),
rec AS (SELECT * FROM bench_raw.operations WHERE tenant = 'bench'::text AND key = ('pgb-u-' || :client_id::text || '-' || :r::text)),
claim AS MATERIALIZED (SELECT lk.locked,
    lk.locked AND NOT EXISTS (SELECT 1 FROM rec WHERE rec.forget_at > now()) AS claimed FROM lk),
w0 AS (INSERT INTO bench_raw.operations (tenant, key, action, version, fingerprint, field_hashes, resource, outcome,
        response_body, created_at, completed_at, expires_at, forget_at, resource_version)
    SELECT 'bench'::text, ('pgb-u-' || :client_id::text || '-' || :r::text)::text, 'update-note'::text, 1::int,
        sha256(convert_to(:r::text, 'UTF8'))::bytea,
        ('{"id": "' || md5(:client_id::text) || md5(:r::text) || '", "body": "' || md5(:r::text) || md5(current_setting('bench.next'))
          || '", "title": "' || md5(current_setting('bench.next')) || md5(:r::text) || '", "if_match": "' || md5((current_setting('bench.next')::int - 1)::text) || md5(:client_id::text) || '"}')::jsonb,
        nullif('/v1/notes/' || md5('pgb-note-' || :client_id::text)::uuid::text, ''), 'updated'::text,
        convert_to(rpad('{"id":"' || md5('pgb-note-' || :client_id::text)::uuid::text, 442, '","title":"bench edit lorem ipsum'), 'UTF8')::bytea,
        now(), now(), now() + interval '72 hours', now() + interval '720 hours', current_setting('bench.next')::int
    FROM claim WHERE claim.claimed
    ON CONFLICT (tenant, key) DO UPDATE SET action = EXCLUDED.action, version = EXCLUDED.version,
        fingerprint = EXCLUDED.fingerprint, field_hashes = EXCLUDED.field_hashes, resource = EXCLUDED.resource,
        outcome = EXCLUDED.outcome, response_body = EXCLUDED.response_body, created_at = EXCLUDED.created_at,
        completed_at = EXCLUDED.completed_at, expires_at = EXCLUDED.expires_at, forget_at = EXCLUDED.forget_at,
        resource_version = EXCLUDED.resource_version,
        compacted_at = NULL, replays = 0, cleaned_events = NULL
    WHERE operations.forget_at <= EXCLUDED.created_at
    RETURNING true AS written),
w1 AS (INSERT INTO bench_raw.outbox_events (id, tenant, operation_key, aggregate_id, type, payload, traceparent, created_at, tracestate)
    SELECT gen_random_uuid(), 'bench'::text, nullif('pgb-u-' || :client_id::text || '-' || :r::text, ''),
        md5('pgb-note-' || :client_id::text)::uuid, 'note.updated'::text,
        convert_to(rpad('{"specversion":"1.0","id":"' || gen_random_uuid()::text, 688, '","data":{"title":"bench edit lorem ipsum'), 'UTF8')::bytea,
        nullif('', ''), now(), nullif('', '')
    FROM w0 WHERE w0.written)
SELECT claim.locked,
    set_config('quill.claimed', CASE WHEN EXISTS (SELECT 1 FROM w0) THEN 'on' ELSE 'off' END, true)::boolean,
    rec.key, rec.action, rec.version, rec.fingerprint, rec.field_hashes,
    coalesce(rec.resource, ''), rec.outcome, rec.response_body,
    rec.created_at, rec.completed_at, rec.expires_at, rec.forget_at, rec.compacted_at, rec.resource_version
FROM claim LEFT JOIN rec ON true;
UPDATE bench_raw.notes SET title = 'bench edit pgb-u-' || :client_id::text || '-' || :r::text,
    body = 'pgb-u-' || :client_id::text || '-' || :r::text || ' ' || rpad('lorem ipsum ', 200, 'lorem ipsum dolor sit amet '),
    version = current_setting('bench.next')::int, updated_at = now()
WHERE tenant = 'bench' AND id = md5('pgb-note-' || :client_id::text)::uuid AND current_setting('quill.claimed'::text)::boolean;
COMMIT;
\endpipeline
