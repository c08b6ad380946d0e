package stream_test

import (
	"fmt"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/stream"
)

// The subjects of one stream: what a relay publishes on, what a consumer
// of one event type filters on, and the tenant read back from a subject.
func ExampleSubject() {
	c := stream.Config{}.WithDefaults()
	subject := contract.Subject(c.SubjectPrefix, "acme", "note.created")
	fmt.Println(c.Name, contract.AllSubjects(c.SubjectPrefix))
	fmt.Println(subject)
	fmt.Println(contract.TypeSubjects(c.SubjectPrefix, "note.created"))
	fmt.Println(contract.SubjectTenant(c.SubjectPrefix, subject))
	// Output:
	// QUILL_EVENTS quill.>
	// quill.acme.note.created
	// quill.*.note.created
	// acme
}
