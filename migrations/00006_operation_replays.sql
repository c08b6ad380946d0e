-- +goose Up

-- How often each operation's recorded outcome was replayed to a retry
-- (answered with Idempotent-Replayed: true). The API counts replays in
-- memory and adds them here in batches about once a second and at shutdown,
-- so the replay path stays free of database writes; a process killed with
-- SIGKILL loses at most its last unflushed second of counts. `api audit`
-- reports the sum as the API layer's suppressed duplicates.
ALTER TABLE operations ADD COLUMN replays integer NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE operations DROP COLUMN replays;
