package attachment_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/quillhq/quill/internal/attachment"
)

// The worker's use of Process: a *PermanentError marks the attachment failed
// with its reason; any other error is retried.
func ExampleProcess() {
	data := []byte("hello, world\nsecond line")
	sum := sha256.Sum256(data)
	in := attachment.Input{ContentType: "text/plain", Filename: "hello.txt", Size: len(data), SHA256: hex.EncodeToString(sum[:]), Data: data}

	for _, in := range []attachment.Input{in, {Size: 25, SHA256: in.SHA256, Data: data}} {
		res, err := attachment.Process(in, attachment.Limits{})
		var perr *attachment.PermanentError
		switch {
		case errors.As(err, &perr):
			fmt.Println("failed:", perr.Reason)
		case err != nil:
			fmt.Println("retry later:", err)
		default:
			js, _ := res.JSON()
			fmt.Println("processed:", string(js))
		}
	}
	// Output:
	// processed: {"detected_type":"text/plain; charset=utf-8","thumbnail":null,"text":{"lines":2,"words":4,"preview":"hello, world\nsecond line"}}
	// failed: size mismatch: declared 25 bytes, got 24
}
