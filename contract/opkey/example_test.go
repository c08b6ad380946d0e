package opkey_test

import (
	"errors"
	"fmt"

	"github.com/quillhq/quill/contract/opkey"
)

func ExampleParse() {
	for _, v := range []string{`note-42`, `"note-42"`, `a, b`} {
		key, err := opkey.Parse(v)
		fmt.Printf("%-10s %q %v\n", v, key, errors.Is(err, opkey.ErrInvalid))
	}
	// Output:
	// note-42    "note-42" false
	// "note-42"  "note-42" false
	// a, b       "" true
}
