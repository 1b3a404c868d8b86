package transform

import (
	"flag"
	"strings"
)

// Flags are the optimizer's command-line settings:
//
//	--config FILE      a YAML file merged over default.yaml (repeatable, applied in order)
//	--set KEY=VALUE    one setting merged last (repeatable), e.g. transforms.cleanup_cse.enabled=false
//	--dump-graphs DIR  dump the graph after every transform (overrides $LOOM_DUMP_GRAPHS_DIR)
//	--check            verify the graph after every transform
//
// A cobra or pflag command adds them with AddGoFlagSet. Enable is no flag: a caller that
// needs transforms on sets it in code (see ConfigOptions.Enable).
type Flags struct {
	Configs    []string
	Sets       []string
	DumpGraphs string
	Check      bool
	Enable     []*Transform
}

// Register adds the flags to fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.Var((*listFlag)(&f.Configs), "config", "YAML `file` merged over the default transform configuration (repeatable)")
	fs.Var((*listFlag)(&f.Sets), "set", "transform setting `key=value`, such as transforms.cleanup_cse.enabled=false (repeatable)")
	fs.StringVar(&f.DumpGraphs, "dump-graphs", "", "write the graph after every transform, and index.html, to `dir`")
	fs.BoolVar(&f.Check, "check", false, "verify the graph after every transform")
}

// Optimizer loads the configuration the flags name, with arch's overlay and f.Enable, and
// returns an optimizer set up by them.
func (f *Flags) Optimizer(arch string) (*Optimizer, error) {
	cfg, err := LoadConfig(ConfigOptions{Arch: arch, Files: f.Configs, Enable: f.Enable, Sets: f.Sets})
	if err != nil {
		return nil, err
	}
	return &Optimizer{Config: cfg, Check: f.Check, DumpDir: f.DumpGraphs}, nil
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }
func (l *listFlag) Type() string       { return "stringArray" }
