// Package systemd holds Quill's systemd units — quill-migrate (api migrate,
// a oneshot), quill-api, quill-relay and quill-attachment-worker (Type=notify
// daemons, hardened) — and the example of their environment file,
// quill.env.example; docs/operations.md says how to install them. Its tests
// check the units against the programs they run: commands, readiness,
// signals, stop timeouts, settings, and systemd-analyze where it is
// installed. It has no exported API.
package systemd
