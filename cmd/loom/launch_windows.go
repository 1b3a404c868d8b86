package main

import (
	"os"
	"syscall"
)

// rankProcAttr: Windows has no process groups to signal; ranks start as plain children.
func rankProcAttr() *syscall.SysProcAttr { return nil }

// signalGroup stops p: Windows delivers no other signal to a child process, so every signal
// kills it.
func signalGroup(p *os.Process, _ syscall.Signal) { _ = p.Kill() }
