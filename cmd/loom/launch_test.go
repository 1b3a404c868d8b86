package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// The launch tests run /bin/sh as the ranks' command: no GPU is needed.

// syncBuffer (serve_test.go) collects the ranks' output.

func sortedLines(s string) []string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	sort.Strings(lines)
	return lines
}

func TestLaunchSetsTheWorld(t *testing.T) {
	var out, errOut syncBuffer
	root := newRootCmd()
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"launch", "--nproc", "3", "--", "/bin/sh", "-c",
		`echo "rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK master=$MASTER_ADDR:$MASTER_PORT"; printf 'to stderr\nno newline' >&2`})
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	lines := sortedLines(out.String())
	re := regexp.MustCompile(`^\[rank (\d)\] rank=(\d) world=3 local=(\d) master=127\.0\.0\.1:(\d+)$`)
	ports := map[string]bool{}
	for i, l := range lines {
		m := re.FindStringSubmatch(l)
		if len(lines) != 3 || m == nil || m[1] != m[2] || m[2] != m[3] || m[1] != string(rune('0'+i)) || m[4] == "0" {
			t.Fatalf("stdout:\n%s\nwant one line per rank with RANK=LOCAL_RANK, WORLD_SIZE=3 and a master port", out.String())
		}
		ports[m[4]] = true
	}
	if len(ports) != 1 {
		t.Errorf("ranks got different master ports: %v", ports)
	}
	want := []string{"[rank 0] no newline", "[rank 0] to stderr", "[rank 1] no newline", "[rank 1] to stderr", "[rank 2] no newline", "[rank 2] to stderr"}
	if got := sortedLines(errOut.String()); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("stderr lines %q, want %q", got, want)
	}
}

func TestLaunchFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		nproc  int
		script string
		want   string
	}{
		{"rank 1 exits non-zero", 3, `if [ "$RANK" = 1 ]; then echo failing; exit 7; fi; sleep 30`, "launch: rank 1 exited with status 7; the other ranks were stopped"},
		{"rank 0 dies of a signal", 2, `if [ "$RANK" = 0 ]; then kill -SEGV $$; fi; sleep 30`, "launch: rank 0 was killed by signal segmentation fault"},
		// The survivors ignore SIGTERM (and so does their sleep): only SIGKILL after the
		// grace period stops them.
		{"survivors ignore SIGTERM", 2, `trap "" TERM; if [ "$RANK" = 1 ]; then exit 2; fi; sleep 30`, "launch: rank 1 exited with status 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out syncBuffer
			start := time.Now()
			err := runLaunch(context.Background(), launchOptions{nproc: tc.nproc, grace: 300 * time.Millisecond,
				argv: []string{"/bin/sh", "-c", tc.script}, stdout: &out, stderr: &out, signals: make(chan os.Signal)})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q; output:\n%s", err, tc.want, out.String())
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v: the other ranks were not stopped", d)
			}
		})
	}
}

func TestLaunchForwardsSignals(t *testing.T) {
	var out syncBuffer
	sigs := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() {
		done <- runLaunch(context.Background(), launchOptions{nproc: 2, grace: 5 * time.Second,
			argv:   []string{"/bin/sh", "-c", `trap 'echo got INT; exit 0' INT; echo ready; while :; do sleep 0.05; done`},
			stdout: &out, stderr: &out, signals: sigs})
	}()
	for deadline := time.Now().Add(10 * time.Second); strings.Count(out.String(), "ready") < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the ranks did not start:\n%s", out.String())
		}
	}
	sigs <- os.Interrupt
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "interrupted (interrupt); forwarded to every rank") {
			t.Errorf("got %v, want the interruption reported", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the ranks did not exit after SIGINT")
	}
	for _, want := range []string{"[rank 0] got INT", "[rank 1] got INT"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestLaunchContextCancelStopsRanks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	err := runLaunch(ctx, launchOptions{nproc: 2, grace: time.Second, argv: []string{"/bin/sh", "-c", "sleep 30"},
		stdout: &syncBuffer{}, stderr: &syncBuffer{}, signals: make(chan os.Signal)})
	if err == nil || !strings.Contains(err.Error(), "interrupted (context canceled)") || time.Since(start) > 5*time.Second {
		t.Errorf("got %v after %v, want an interruption within a second", err, time.Since(start))
	}
}

func TestLaunchInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    launchOptions
		want string
	}{
		{"no ranks", launchOptions{nproc: 0, argv: []string{"/bin/true"}}, "--nproc 0, want at least 1"},
		{"no command", launchOptions{nproc: 1}, "no command"},
		{"bad port", launchOptions{nproc: 1, port: 70000, argv: []string{"/bin/true"}}, "--master-port 70000 is not a TCP port"},
		{"missing program", launchOptions{nproc: 2, argv: []string{"/nonexistent/loom-rank"}}, "start rank 0 (/nonexistent/loom-rank)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.stdout, tc.o.stderr, tc.o.signals = &syncBuffer{}, &syncBuffer{}, make(chan os.Signal)
			if err := runLaunch(context.Background(), tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
	root := newRootCmd()
	root.SetOut(&syncBuffer{})
	root.SetErr(&syncBuffer{})
	root.SetArgs([]string{"launch", "--nproc", "2"})
	if err := root.ExecuteContext(context.Background()); err == nil || !strings.Contains(err.Error(), "requires at least 1 arg") {
		t.Errorf("launch without a command: got %v", err)
	}
}

func TestPrefixWriter(t *testing.T) {
	var mu sync.Mutex
	var b bytes.Buffer
	p := &prefixWriter{mu: &mu, w: &b, prefix: "[rank 4] "}
	for _, chunk := range []string{"a", "b\nc\n", "", "d", "e\nf"} {
		if n, err := p.Write([]byte(chunk)); n != len(chunk) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", chunk, n, err)
		}
	}
	p.flush()
	if want := "[rank 4] ab\n[rank 4] c\n[rank 4] de\n[rank 4] f\n"; b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
	b.Reset()
	p.Write(bytes.Repeat([]byte("x"), maxLine+1))
	if n := strings.Count(b.String(), "[rank 4] "); n != 1 || len(p.buf) != 0 {
		t.Errorf("a line longer than maxLine: %d prefixes written, %d bytes pending", n, len(p.buf))
	}
}
