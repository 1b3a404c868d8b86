// Package gputest decides what a test that needs GPUs does on a machine without enough of
// them: it skips, saying how many GPUs it found and why no more, or, when the environment
// sets LOOM_REQUIRE_GPU=1 (make gpu-test, the GPU machine), it fails with the same message.
// A GPU run can then never pass by skipping its GPU tests.
//
// The package does not count GPUs itself: it imports nothing of Loom, so that cubind's own
// tests can use it. Each package's test helper counts them its own way (cubind.Available
// and cubind.DeviceCount, an open test device, NCCL) and hands the count to Need; a
// missing library that GPU tests need (NVRTC, cuBLASLt, NCCL) goes to Missing.
package gputest

import (
	"fmt"
	"os"
	"testing"
)

// Env is the variable that turns a skip for want of a GPU into a failure; it is set to "1"
// on machines that have the GPUs (make gpu-test).
const Env = "LOOM_REQUIRE_GPU"

// Required reports whether the environment sets LOOM_REQUIRE_GPU=1.
func Required() bool { return os.Getenv(Env) == "1" }

// Verdict is what a test does about its GPUs.
type Verdict int

const (
	Run  Verdict = iota // enough GPUs: the test goes on
	Skip                // too few, and none are required here
	Fail                // too few, but LOOM_REQUIRE_GPU=1
)

func (v Verdict) String() string {
	switch v {
	case Run:
		return "run"
	case Skip:
		return "skip"
	case Fail:
		return "fail"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Decide is the rule: a test that needs need GPUs on a machine where found can be used
// runs when found >= need; otherwise it fails when require is set, else it skips. The
// message says how many GPUs were found and how many the test needs, with why (the error
// that stopped the count, if any), and for a skip how to make it a failure.
func Decide(found, need int, require bool, why error) (Verdict, string) {
	if found >= need {
		return Run, ""
	}
	var msg string
	switch {
	case found == 0:
		msg = fmt.Sprintf("no GPU found, the test needs %d", need)
	case found == 1:
		msg = fmt.Sprintf("1 GPU found, the test needs %d", need)
	default:
		msg = fmt.Sprintf("%d GPUs found, the test needs %d", found, need)
	}
	if why != nil {
		msg += ": " + why.Error()
	}
	if require {
		return Fail, Env + "=1, but " + msg
	}
	return Skip, msg + " (" + Env + "=1 makes this a failure)"
}

// Need applies Decide to t: it returns when found >= need, else it skips t or, with
// LOOM_REQUIRE_GPU=1, fails it. why, when not nil, says why no more GPUs could be used.
func Need(t testing.TB, need, found int, why error) {
	t.Helper()
	v, msg := Decide(found, need, Required(), why)
	apply(t, v, msg)
}

// Missing skips t, or fails it with LOOM_REQUIRE_GPU=1, because what (a library the GPU
// tests need, such as "NVRTC" or "cuBLASLt") cannot be used; err says why. It does
// nothing when err is nil.
func Missing(t testing.TB, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	v, msg := decideMissing(what, Required(), err)
	apply(t, v, msg)
}

func decideMissing(what string, require bool, err error) (Verdict, string) {
	msg := "no " + what + ": " + err.Error()
	if require {
		return Fail, Env + "=1, but " + msg
	}
	return Skip, msg + " (" + Env + "=1 makes this a failure)"
}

func apply(t testing.TB, v Verdict, msg string) {
	t.Helper()
	switch v {
	case Fail:
		t.Fatal(msg)
	case Skip:
		t.Skip(msg)
	}
}
