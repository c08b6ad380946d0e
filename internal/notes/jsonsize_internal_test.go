package notes

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// A note's JSON, its strings unescaped, fits the buffer a create makes for
// it: with and without an attachment, at the largest version and size.
func TestNoteViewJSONSize(t *testing.T) {
	t.Parallel()
	now := FormatTime(time.Date(2026, 12, 3, 16, 0, 0, 123456000, time.UTC))
	att := &AttachmentView{ID: uuid.NewString(), Filename: "scan.png", ContentType: "image/png", Size: 1<<31 - 1,
		SHA256: strings.Repeat("ab", 32), Status: AttachmentPending}
	for _, v := range []NoteView{
		{ID: uuid.NewString(), Title: "groceries", Body: "milk", CreatedAt: now, Version: 1, UpdatedAt: now},
		{ID: uuid.NewString(), Title: "", Body: "", CreatedAt: now, Version: 1<<31 - 1, UpdatedAt: now},
		{ID: uuid.NewString(), Title: strings.Repeat("t", 200), Body: strings.Repeat("b", 4000), CreatedAt: now, Version: 1<<31 - 1, UpdatedAt: now, Attachment: att},
	} {
		got, err := v.AppendJSON(nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > v.jsonSize() {
			t.Errorf("%d bytes of JSON over the %d made for them: %s", len(got), v.jsonSize(), got)
		}
	}
}
