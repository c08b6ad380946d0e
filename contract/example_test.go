package contract_test

import (
	"fmt"

	"github.com/quillhq/quill/contract"
)

// A consumer of note.created events of tenant acme, on the default
// subject prefix, and the note an event's data names.
func Example() {
	fmt.Println(contract.Subject(contract.DefaultSubjectPrefix, "acme", contract.EventNoteCreated))
	fmt.Println(contract.CloudEventType(contract.EventNoteCreated))
	fmt.Println(contract.NotePath("01a229cf-df18-7236-a349-3735bd4a95ce"))
	// Output:
	// quill.acme.note.created
	// quill.note.created.v1
	// /v1/notes/01a229cf-df18-7236-a349-3735bd4a95ce
}
