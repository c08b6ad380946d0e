package webhooktest

import "syscall"

// sysProcAttr makes the kernel kill the receiver when the test binary dies
// (a panic, go test's -timeout), so no receiver outlives its test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
