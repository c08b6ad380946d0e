-- notesearch's own table: one row per note a tenant ever had, in the
-- service's own schema. A deleted note keeps its row as a tombstone
-- (deleted_at set, title and body length cleared), so that a create that
-- arrives after its delete finds the tombstone and resurrects nothing.
-- created_applied, updated_applied and deleted_applied count the events
-- applied to the row: each event is applied once. version is the note's
-- version of the event applied last (NULL while its events had none).
CREATE TABLE IF NOT EXISTS notesearch_notes (
    tenant          text        NOT NULL,
    note_id         uuid        NOT NULL,
    title           text,
    title_tsv       tsvector    GENERATED ALWAYS AS (to_tsvector('simple', coalesce(title, ''))) STORED,
    body_length     integer,
    created_at      timestamptz,
    deleted_at      timestamptz,
    created_applied integer     NOT NULL DEFAULT 0,
    deleted_applied integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, note_id)
);

CREATE INDEX IF NOT EXISTS notesearch_notes_title_tsv ON notesearch_notes USING gin (title_tsv);

-- Added with note.updated: tables made before it gain the columns.
ALTER TABLE notesearch_notes ADD COLUMN IF NOT EXISTS version bigint;
ALTER TABLE notesearch_notes ADD COLUMN IF NOT EXISTS updated_applied integer NOT NULL DEFAULT 0;
