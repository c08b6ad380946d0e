//go:build !unix

package client

import "os"

// tryLock is a no-op where flock(2) does not exist: there, concurrent quill
// processes over one journal are not excluded (decision 0043).
func tryLock(*os.File) error { return nil }
