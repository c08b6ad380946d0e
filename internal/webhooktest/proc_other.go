//go:build !linux

package webhooktest

import "syscall"

// sysProcAttr has nothing to add where there is no Pdeathsig: the cleanup
// stops the receiver.
func sysProcAttr() *syscall.SysProcAttr { return nil }
