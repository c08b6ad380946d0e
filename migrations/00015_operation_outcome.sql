-- +goose Up

-- An operation record keeps what the operation did — its outcome, in its
-- action's words — and the body its handler rendered, instead of an HTTP
-- status and a Location (decision 0073): the API maps an outcome to its
-- status and headers (SPEC §3), so the notes service speaks no HTTP. A
-- replay of a record written before this migration is byte-identical: each
-- status the API recorded names exactly one outcome of its action (201 a
-- create, 200 a delete that deleted, 404 one that found nothing to delete),
-- and a create's Location was always its resource. A row that fits none of
-- this stops the migration rather than lose what it would replay.
ALTER TABLE operations ADD COLUMN outcome text;
UPDATE operations SET outcome = CASE
    WHEN action = 'create-note' AND response_status = 201 THEN 'created'
    WHEN action = 'delete-note' AND response_status = 200 THEN 'deleted'
    WHEN action = 'delete-note' AND response_status = 404 THEN 'nothing_to_delete'
END;
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM operations WHERE outcome IS NULL
               OR (response_location IS NOT NULL AND response_location IS DISTINCT FROM resource)
               OR (response_location IS NOT NULL AND outcome <> 'created')) THEN
        RAISE EXCEPTION 'operations holds a record whose response names no outcome (an unknown status, or a Location that is not its resource)';
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE operations ALTER COLUMN outcome SET NOT NULL,
    DROP COLUMN response_status, DROP COLUMN response_location;

-- +goose Down
ALTER TABLE operations ADD COLUMN response_status integer, ADD COLUMN response_location text;
UPDATE operations SET
    response_status = CASE outcome WHEN 'created' THEN 201 WHEN 'deleted' THEN 200 WHEN 'nothing_to_delete' THEN 404 END,
    response_location = CASE WHEN outcome = 'created' AND response_body IS NOT NULL THEN resource END;
ALTER TABLE operations ALTER COLUMN response_status SET NOT NULL, DROP COLUMN outcome;
