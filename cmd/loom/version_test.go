package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// loom version prints the module, a revision line and the Go version; --version the short form.
func TestVersion(t *testing.T) {
	stdout, _, err := run(t, "version")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"loom ", "module:   github.com/loom-ml/loom", "revision: ", "go:       " + runtime.Version()} {
		if !strings.Contains(stdout, want) {
			t.Errorf("loom version lacks %q:\n%s", want, stdout)
		}
	}
	short, _, err := run(t, "--version")
	if err != nil || !strings.Contains(short, runtime.Version()) {
		t.Errorf("loom --version: %q, %v", short, err)
	}
	if _, _, err := run(t, "version", "extra"); err == nil {
		t.Error("loom version extra: no error")
	}
}

// The VCS stamp of a build from a checkout is read into the version: revision, time, dirty.
func TestVersionFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Path: "github.com/loom-ml/loom", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"}, {Key: "vcs.time", Value: "2025-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"}}}
	v := versionFrom(bi, buildVersion{})
	text := v.String()
	for _, want := range []string{"loom v0.3.0\n", "revision: 0123456789abcdef0123456789abcdef01234567 (+dirty", "time:     2025-01-02T03:04:05Z", "go:       go1.99.1"} {
		if !strings.Contains(text, want) {
			t.Errorf("version lacks %q:\n%s", want, text)
		}
	}
	if s := v.short(); s != "v0.3.0 (0123456789ab+dirty) go1.99.1" {
		t.Errorf("short = %q", s)
	}
	if s := versionFrom(&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, buildVersion{Go: "go1.2"}).String(); !strings.Contains(s, "revision: unknown") {
		t.Errorf("no VCS stamp: %s", s)
	}
}
