// Package postgres holds roles.sql, the SQL an operator runs once to create
// Quill's two PostgreSQL roles — the owner, which owns the schema and runs
// the migrations, and the runtime role, which may only read and write rows
// (docs/operations.md, "Database roles") — and embeds it, so that the tests
// run the very file the documentation gives.
package postgres

import _ "embed"

// RolesSQL is roles.sql: psql's syntax, with the variables :"owner",
// :"runtime" and :"schema" (identifiers).
//
//go:embed roles.sql
var RolesSQL string
