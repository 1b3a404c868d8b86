//go:build !windows

package main

import (
	"os"
	"syscall"
)

// rankProcAttr makes a rank lead its own process group, so that signalGroup reaches the
// processes it starts too.
func rankProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// signalGroup sends sig to the process group that p leads.
func signalGroup(p *os.Process, sig syscall.Signal) { _ = syscall.Kill(-p.Pid, sig) }
