-- The notes api_update_equivalent.sql updates, one per pgbench client (psql
-- variable clients: pgbench -c), as loadgen --mode update creates one per
-- client before its window: version 1, a title and a 200-byte body, no
-- attachment. Client i (pgbench's :client_id, 0-based) owns the note with id
-- md5('pgb-note-' || i). Run by scripts/bench-api.sh after truncate.sql as:
-- psql -v clients=C -f api_update_seed.sql. (The API's setup creates also
-- write their C operation records and events; this writes the notes alone.)
INSERT INTO bench_raw.notes (id, tenant, title, body, created_at, version, updated_at)
SELECT md5('pgb-note-' || i::text)::uuid, 'bench', 'bench note pgb-note-' || i::text,
       rpad('lorem ipsum ', 200, 'lorem ipsum dolor sit amet '), now(), 1, now()
FROM generate_series(0, :clients - 1) AS i;
