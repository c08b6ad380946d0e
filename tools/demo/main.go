// Command demo tells the article's story against a running Quill (`make
// demo`, after `make dev`): an agent creates a note with an attachment, the
// response is lost on the way back — a fault-injecting proxy in front of the
// API drops it after the API committed — and the agent retries with the same
// operation key and gets the replay; it looks the key up and prints the
// operation's explained final state: one note, its note.created event
// published with its stream sequence, its attachment processed. Then the same
// key with a changed title (refused: 422) and the same title under a new key
// (a second, legitimate note).
//
// It talks to the API over HTTP only, as an agent would, and exits 0 when
// every step behaved as promised, 1 when one did not (saying which), 2 on a
// usage error.
package main

import "github.com/quillhq/quill/internal/cli"

func main() { cli.Main("demo", run) }
