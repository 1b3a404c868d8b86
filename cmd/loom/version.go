package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// buildVersion describes the running binary from its build information: the module
// version (a tag for go install ...@vX, "(devel)" for a build from a checkout), the VCS
// revision and time the go tool stamped in (with "+dirty" for uncommitted changes) and the
// Go version it was built with.
type buildVersion struct {
	Module, Version, Revision, Time, Go, Platform string
	Modified                                      bool
}

func readBuildVersion() buildVersion {
	v := buildVersion{Module: "github.com/loom-ml/loom", Version: "unknown", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	return versionFrom(bi, v)
}

// versionFrom fills v from bi.
func versionFrom(bi *debug.BuildInfo, v buildVersion) buildVersion {
	if bi.Main.Path != "" {
		v.Module = bi.Main.Path
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// short is the one-line form (loom --version).
func (v buildVersion) short() string {
	s := v.Version
	if v.Revision != "" {
		rev := v.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		s += " (" + rev
		if v.Modified {
			s += "+dirty"
		}
		s += ")"
	}
	return s + " " + v.Go
}

func (v buildVersion) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "loom %s\n", v.Version)
	fmt.Fprintf(&sb, "module:   %s\n", v.Module)
	rev := v.Revision
	switch {
	case rev == "":
		rev = "unknown (built without VCS information: go build -buildvcs=false, or outside a git checkout)"
	case v.Modified:
		rev += " (+dirty: uncommitted changes)"
	}
	fmt.Fprintf(&sb, "revision: %s\n", rev)
	if v.Time != "" {
		fmt.Fprintf(&sb, "time:     %s\n", v.Time)
	}
	fmt.Fprintf(&sb, "go:       %s %s\n", v.Go, v.Platform)
	return sb.String()
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print Loom's version, VCS revision and Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := fmt.Fprint(cmd.OutOrStdout(), readBuildVersion())
			return err
		},
	}
}
