package db

// SQLGroupSessionSettings exposes, to the external tests, the statement
// that opens each of a group's transactions behind a pooler.
const SQLGroupSessionSettings = sqlGroupSessionSettings
