-- +goose Up

-- Edits (decision 0078). A note has a version: 1 when created, one more for
-- each accepted update, one more again when deleted (its note.deleted
-- carries that version, so a consumer orders the delete after every
-- update). Existing notes are at version 1. updated_at is NULL for notes
-- written before this migration, which reads as their created_at: filling
-- it here would rewrite every row under an exclusive lock.
ALTER TABLE notes ADD COLUMN version integer NOT NULL DEFAULT 1 CHECK (version >= 1),
    ADD COLUMN updated_at timestamptz;

-- The version of the resource an operation left, replayed as its ETag; NULL
-- for operations that left none (a 404, a 412) and for those recorded before
-- this migration, which are replayed without an ETag as they were answered.
ALTER TABLE operations ADD COLUMN resource_version integer;

-- The create's operation key on its attachment, so that the worker writes
-- the attachment.processed event under it and the create's outcome lookup
-- lists it (SPEC §4.6: every effect the operation caused). NULL for
-- attachments created before this migration: their lookups list the
-- attachment's state but not its event.
ALTER TABLE attachments ADD COLUMN operation_key text;

-- +goose Down
ALTER TABLE attachments DROP COLUMN operation_key;
ALTER TABLE operations DROP COLUMN resource_version;
ALTER TABLE notes DROP COLUMN updated_at, DROP COLUMN version;
