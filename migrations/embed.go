// Package migrations embeds Quill's PostgreSQL schema migrations, applied in
// order by goose (see internal/db.Migrate).
package migrations

import "embed"

// FS holds the goose SQL migrations, named NNNNN_description.sql.
//
//go:embed *.sql
var FS embed.FS
