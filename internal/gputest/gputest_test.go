package gputest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestDecide(t *testing.T) {
	noDriver := errors.New("libcuda.so.1: not found")
	for _, tc := range []struct {
		found, need int
		require     bool
		why         error
		want        Verdict
		msg         []string // substrings of the message
	}{
		{found: 1, need: 1, want: Run},
		{found: 1, need: 1, require: true, want: Run},
		{found: 8, need: 2, require: true, want: Run},
		{found: 0, need: 1, want: Skip, msg: []string{"no GPU found, the test needs 1", "LOOM_REQUIRE_GPU=1 makes this a failure"}},
		{found: 0, need: 1, why: noDriver, want: Skip, msg: []string{"no GPU found, the test needs 1: libcuda.so.1: not found"}},
		{found: 0, need: 1, require: true, why: noDriver, want: Fail, msg: []string{"LOOM_REQUIRE_GPU=1, but no GPU found, the test needs 1: libcuda.so.1: not found"}},
		// Fewer GPUs than the test needs is a failure too when GPUs are required.
		{found: 1, need: 2, want: Skip, msg: []string{"1 GPU found, the test needs 2"}},
		{found: 1, need: 2, require: true, want: Fail, msg: []string{"LOOM_REQUIRE_GPU=1, but 1 GPU found, the test needs 2"}},
		{found: 3, need: 4, require: true, want: Fail, msg: []string{"3 GPUs found, the test needs 4"}},
	} {
		t.Run(fmt.Sprintf("found%d_need%d_require%v", tc.found, tc.need, tc.require), func(t *testing.T) {
			v, msg := Decide(tc.found, tc.need, tc.require, tc.why)
			if v != tc.want {
				t.Errorf("verdict %v, want %v (%q)", v, tc.want, msg)
			}
			if v == Run && msg != "" {
				t.Errorf("run with a message %q", msg)
			}
			for _, s := range tc.msg {
				if !strings.Contains(msg, s) {
					t.Errorf("message %q lacks %q", msg, s)
				}
			}
			if v == Fail && strings.Contains(msg, "makes this a failure") {
				t.Errorf("a failure's message %q tells how to make it one", msg)
			}
		})
	}
}

// recorder is a testing.TB that records Skip and Fatal instead of ending the test.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()           {}
func (r *recorder) Skip(args ...any)  { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatal(args ...any) { r.failed = fmt.Sprint(args...) }
func (r *recorder) Fatalf(string, ...any) {
	panic("gputest calls Fatal, not Fatalf")
}

// Need and Missing read LOOM_REQUIRE_GPU and act on the verdict.
func TestNeedAndMissing(t *testing.T) {
	for _, tc := range []struct {
		env                string
		call               func(tb testing.TB)
		skipped, failed    string
		neitherSkipNorFail bool
	}{
		{env: "", call: func(tb testing.TB) { Need(tb, 2, 1, nil) }, skipped: "1 GPU found, the test needs 2"},
		{env: "0", call: func(tb testing.TB) { Need(tb, 1, 0, nil) }, skipped: "no GPU found"},
		{env: "1", call: func(tb testing.TB) { Need(tb, 2, 1, nil) }, failed: "LOOM_REQUIRE_GPU=1, but 1 GPU found, the test needs 2"},
		{env: "1", call: func(tb testing.TB) { Need(tb, 2, 2, nil) }, neitherSkipNorFail: true},
		{env: "", call: func(tb testing.TB) { Missing(tb, "NVRTC", errors.New("libnvrtc.so: not found")) }, skipped: "no NVRTC: libnvrtc.so: not found"},
		{env: "1", call: func(tb testing.TB) { Missing(tb, "cuBLASLt", errors.New("not beside libcublas")) }, failed: "LOOM_REQUIRE_GPU=1, but no cuBLASLt: not beside libcublas"},
		{env: "1", call: func(tb testing.TB) { Missing(tb, "NCCL", nil) }, neitherSkipNorFail: true},
	} {
		t.Setenv(Env, tc.env)
		r := &recorder{TB: t}
		tc.call(r)
		switch {
		case tc.neitherSkipNorFail:
			if r.skipped != "" || r.failed != "" {
				t.Errorf("env %q: skipped %q, failed %q; want neither", tc.env, r.skipped, r.failed)
			}
		case tc.skipped != "":
			if !strings.Contains(r.skipped, tc.skipped) || r.failed != "" {
				t.Errorf("env %q: skipped %q, failed %q; want a skip with %q", tc.env, r.skipped, r.failed, tc.skipped)
			}
		default:
			if !strings.Contains(r.failed, tc.failed) || r.skipped != "" {
				t.Errorf("env %q: skipped %q, failed %q; want a failure with %q", tc.env, r.skipped, r.failed, tc.failed)
			}
		}
	}
}
