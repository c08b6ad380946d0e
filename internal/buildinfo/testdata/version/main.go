// Command version prints buildinfo.Read's line: the program the stamping
// test builds the way make build, the image and a release do.
package main

import (
	"fmt"

	"github.com/quillhq/quill/internal/buildinfo"
)

func main() { fmt.Println(buildinfo.Read().Line("version")) }
