package transform

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// defaultYAML lists every transform with its stage, enabled flag and options.
//
//go:embed default.yaml
var defaultYAML []byte

// builtinOverlays holds the per-architecture overlays shipped with Loom, one
// overlays/<arch>.yaml per architecture that needs one.
//
//go:embed overlays
var builtinOverlays embed.FS

// DefaultYAML returns the embedded default configuration.
func DefaultYAML() []byte { return append([]byte(nil), defaultYAML...) }

// ConfigOptions says which layers LoadConfig merges on top of default.yaml.
type ConfigOptions struct {
	// Arch selects the overlay overlays/<Arch>.yaml, applied first when it exists. Arch is
	// the model_type of the checkpoint's config.json, such as "llama".
	Arch string
	// Overlays is where overlays are looked up; nil means the ones built into Loom.
	Overlays fs.FS
	// Files are user YAML files (--config), applied in order.
	Files []string
	// Enable lists transforms that the caller needs on, such as the engine's cache stage
	// (insert_cached_attention, gather_logits): each is enabled over default.yaml, the
	// overlay and the files, as if by transforms.<name>.enabled=true. Sets still apply after
	// it, so a --set can turn one off again. Enabling does not move a transform: the run order
	// is the listing's, checked against the dependencies as always.
	Enable []*Transform
	// Sets are "key=value" settings (--set), applied last, in order, such as
	// "transforms.cleanup_cse.enabled=false". The value is read as YAML.
	Sets []string
}

// Config is the merged pipeline configuration: one Entry per registered transform, in run
// order (by stage, then in the order default.yaml lists them).
type Config struct {
	entries []*Entry
	byName  map[string]*Entry
}

// Entry is one transform's resolved configuration.
type Entry struct {
	Transform *Transform
	Enabled   bool
	// Options is the decoded option struct, of the type of Transform.Config (nil when the
	// transform has none). Transforms treat it as read-only.
	Options any
}

// Entries returns the entries in run order.
func (c *Config) Entries() []*Entry { return append([]*Entry(nil), c.entries...) }

// Entry returns the named transform's entry, or nil.
func (c *Config) Entry(name string) *Entry { return c.byName[name] }

// LoadConfig merges the configuration layers and decodes every transform's options: the
// embedded default.yaml, then the architecture overlay, then each file, then the caller's
// Enable list, then each setting. Mappings merge key by key at any depth; any other value (a
// scalar or a list) replaces the one below it. An unknown transform, unknown option or value
// of the wrong type is an error that names the key and the file (and line) it came from.
//
// The run order is by stage, then in the order the transforms are first listed (layers merge
// into default.yaml's listing and cannot move a transform). It must keep every transform's
// After declarations; a listing that breaks one is an error naming both transforms and the
// reason.
func LoadConfig(opts ConfigOptions) (*Config, error) {
	layers := []layer{{name: "transform/default.yaml", data: defaultYAML}}
	if opts.Arch != "" {
		fsys, name, src := opts.Overlays, "overlays/"+opts.Arch+".yaml", "overlays/"+opts.Arch+".yaml"
		if fsys == nil {
			fsys, src = builtinOverlays, "transform/"+name
		}
		data, err := fs.ReadFile(fsys, name)
		switch {
		case err == nil:
			layers = append(layers, layer{name: src, data: data})
		case !errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("read overlay for %s: %w", opts.Arch, err)
		}
	}
	for _, f := range opts.Files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read config: %w", err)
		}
		layers = append(layers, layer{name: f, data: data})
	}
	for i, tr := range opts.Enable {
		if tr == nil {
			return nil, fmt.Errorf("ConfigOptions.Enable[%d] is nil", i)
		}
		layers = append(layers, enableLayer(tr.Name))
	}
	for _, s := range opts.Sets {
		layers = append(layers, layer{name: "--set " + s, set: s, isSet: true})
	}
	return loadLayers(layers, registry)
}

// DefaultConfig is the configuration of default.yaml alone.
func DefaultConfig() (*Config, error) { return LoadConfig(ConfigOptions{}) }

// layer is one configuration source: YAML text, one --set setting, or a mapping made in code.
type layer struct {
	name  string
	data  []byte
	set   string
	isSet bool
	root  *yaml.Node // when set, the layer's mapping itself
}

// enableLayer is the layer of ConfigOptions.Enable that turns transform name on.
func enableLayer(name string) layer {
	str := func(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v} }
	mapping := func(k string, v *yaml.Node) *yaml.Node {
		return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: []*yaml.Node{str(k), v}}
	}
	on := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"}
	return layer{name: "ConfigOptions.Enable", root: mapping("transforms", mapping(name, mapping("enabled", on)))}
}

// tree is a merged YAML document that remembers which layer each node came from.
type tree struct {
	root *yaml.Node            // a mapping node
	src  map[*yaml.Node]string // node -> layer name
}

// where names a node's origin: "file:line" (or just the layer name for --set).
func (t *tree) where(n *yaml.Node) string {
	name := t.src[n]
	if strings.HasPrefix(name, "--set ") || n.Line == 0 {
		return name
	}
	return fmt.Sprintf("%s:%d", name, n.Line)
}

// configError names a key and where it was written.
func (t *tree) errorf(n *yaml.Node, path, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %s", t.where(n), path, fmt.Sprintf(format, args...))
}

// loadLayers merges layers and resolves them against the transforms of reg.
func loadLayers(layers []layer, reg map[string]*Transform) (*Config, error) {
	t := &tree{root: &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}, src: map[*yaml.Node]string{}}
	for _, l := range layers {
		root, err := l.parse()
		if err != nil {
			return nil, err
		}
		if root == nil {
			continue
		}
		t.mark(root, l.name)
		if err := t.merge(t.root, root, ""); err != nil {
			return nil, err
		}
	}
	return t.resolve(reg)
}

// parse returns the layer's top-level mapping, or nil when the layer is empty.
func (l layer) parse() (*yaml.Node, error) {
	if l.root != nil {
		return l.root, nil
	}
	if l.isSet {
		return parseSet(l.set)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(l.data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", l.name, err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, nil
	}
	root := resolveAlias(doc.Content[0])
	if root.Tag == "!!null" {
		return nil, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: the configuration must be a mapping, such as \"transforms: {...}\"", l.name, root.Line)
	}
	return root, nil
}

// parseSet turns "a.b.c=value" into the mapping {a: {b: {c: value}}}.
func parseSet(s string) (*yaml.Node, error) {
	key, value, ok := strings.Cut(s, "=")
	if !ok {
		return nil, fmt.Errorf("--set %s: want key=value, such as transforms.cleanup_cse.enabled=false", s)
	}
	parts := strings.Split(strings.TrimSpace(key), ".")
	for _, p := range parts {
		if p == "" {
			return nil, fmt.Errorf("--set %s: empty key component in %q", s, key)
		}
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(value), &doc); err != nil {
		return nil, fmt.Errorf("--set %s: value: %w", s, err)
	}
	leaf := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: ""}
	if len(doc.Content) > 0 {
		leaf = resolveAlias(doc.Content[0])
	}
	node := leaf
	for i := len(parts) - 1; i >= 0; i-- {
		k := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: parts[i]}
		node = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: []*yaml.Node{k, node}}
	}
	return node, nil
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// mark records the layer of every node under n.
func (t *tree) mark(n *yaml.Node, name string) {
	if n == nil {
		return
	}
	if _, seen := t.src[n]; seen && n.Kind == yaml.AliasNode {
		return
	}
	t.src[n] = name
	for _, c := range n.Content {
		t.mark(c, name)
	}
}

// merge deep-merges mapping src into mapping dst; path is dst's key path for errors.
func (t *tree) merge(dst, src *yaml.Node, path string) error {
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(src.Content); i += 2 {
		k, v := src.Content[i], resolveAlias(src.Content[i+1])
		kpath := join(path, k.Value)
		if k.Kind != yaml.ScalarNode {
			return t.errorf(k, path, "keys must be plain names")
		}
		if prev := seen[k.Value]; prev != nil {
			return t.errorf(k, kpath, "key given twice (first at line %d)", prev.Line)
		}
		seen[k.Value] = k
		j := mapIndex(dst, k.Value)
		if j < 0 {
			dst.Content = append(dst.Content, k, v)
			continue
		}
		old := resolveAlias(dst.Content[j+1])
		switch {
		case old.Kind == yaml.MappingNode && v.Kind == yaml.MappingNode:
			if err := t.merge(old, v, kpath); err != nil {
				return err
			}
		case old.Kind == yaml.MappingNode && v.Tag == "!!null":
			// "key:" with nothing after it changes nothing below key.
		default:
			dst.Content[j+1] = v
		}
	}
	return nil
}

func mapIndex(m *yaml.Node, key string) int {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return i
		}
	}
	return -1
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// resolve checks the merged tree and decodes every transform's settings.
func (t *tree) resolve(reg map[string]*Transform) (*Config, error) {
	var transforms *yaml.Node
	for i := 0; i+1 < len(t.root.Content); i += 2 {
		k, v := t.root.Content[i], resolveAlias(t.root.Content[i+1])
		if k.Value != "transforms" {
			return nil, t.errorf(k, k.Value, "unknown key (the configuration has one section, transforms)")
		}
		if v.Kind != yaml.MappingNode {
			return nil, t.errorf(v, "transforms", "want a mapping from transform names to settings")
		}
		transforms = v
	}
	if transforms == nil {
		return nil, errors.New("configuration lists no transforms")
	}
	c := &Config{byName: map[string]*Entry{}}
	keys := map[string]*yaml.Node{} // where each transform is listed
	for i := 0; i+1 < len(transforms.Content); i += 2 {
		k, v := transforms.Content[i], resolveAlias(transforms.Content[i+1])
		path := "transforms." + k.Value
		tr, ok := reg[k.Value]
		if !ok {
			return nil, t.errorf(k, path, "unknown transform (known: %s)", strings.Join(sortedNames(reg), ", "))
		}
		e, err := t.decodeEntry(tr, k, v, path)
		if err != nil {
			return nil, err
		}
		c.entries = append(c.entries, e)
		c.byName[tr.Name] = e
		keys[tr.Name] = k
	}
	var missing []string
	for _, name := range sortedNames(reg) {
		if c.byName[name] == nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("transform/default.yaml does not list the registered transforms %s", strings.Join(missing, ", "))
	}
	sort.SliceStable(c.entries, func(i, j int) bool {
		return c.entries[i].Transform.Stage < c.entries[j].Transform.Stage
	})
	if err := t.checkOrder(c.entries, keys); err != nil {
		return nil, err
	}
	return c, nil
}

// checkOrder holds the run order to every transform's After declarations, enabled or not
// (see Dep). keys are the transforms' keys in the merged tree, for the error.
func (t *tree) checkOrder(entries []*Entry, keys map[string]*yaml.Node) error {
	pos := make(map[string]int, len(entries))
	for i, e := range entries {
		pos[e.Transform.Name] = i
	}
	for i, e := range entries {
		tr := e.Transform
		key, path := keys[tr.Name], "transforms."+tr.Name
		for _, d := range tr.After {
			dep := d.Transform
			j, ok := pos[dep.Name]
			switch {
			case !ok:
				return t.errorf(key, path, "%s must run after %s, which is not registered: %s", tr.Name, dep.Name, d.Why)
			case dep.Stage > tr.Stage:
				return t.errorf(key, path, "%s must run after %s, but its stage %s comes before %s's stage %s: %s",
					tr.Name, dep.Name, tr.Stage, dep.Name, dep.Stage, d.Why)
			case j > i:
				return t.errorf(key, path, "%s must run after %s, but is listed before it (%s is at %s): %s",
					tr.Name, dep.Name, dep.Name, t.where(keys[dep.Name]), d.Why)
			}
		}
	}
	return nil
}

// decodeEntry reads one transform's stage, enabled flag and options.
func (t *tree) decodeEntry(tr *Transform, key, v *yaml.Node, path string) (*Entry, error) {
	if v.Kind != yaml.MappingNode {
		return nil, t.errorf(v, path, "want a mapping with stage, enabled and options")
	}
	e := &Entry{Transform: tr, Options: tr.DefaultConfig()}
	var stageSeen, enabledSeen bool
	opts := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], resolveAlias(v.Content[i+1])
		kpath := join(path, k.Value)
		switch k.Value {
		case "stage":
			stageSeen = true
			if val.Tag != "!!str" {
				return nil, t.errorf(val, kpath, "want a stage name, got %s", describe(val))
			}
			s, err := ParseStage(val.Value)
			if err != nil {
				return nil, t.errorf(val, kpath, "%v", err)
			}
			if s != tr.Stage {
				return nil, t.errorf(val, kpath, "%s runs in stage %s, not %s", tr.Name, tr.Stage, s)
			}
		case "enabled":
			enabledSeen = true
			if val.Tag != "!!bool" {
				return nil, t.errorf(val, kpath, "want true or false, got %s", describe(val))
			}
			e.Enabled = val.Value == "true" || val.Value == "True" || val.Value == "TRUE"
		default:
			opts.Content = append(opts.Content, k, val)
		}
	}
	if !stageSeen || !enabledSeen {
		return nil, t.errorf(key, path, "needs both stage and enabled (transform/default.yaml lists them)")
	}
	if len(opts.Content) == 0 {
		return e, nil
	}
	if tr.Config == nil {
		return nil, t.errorf(opts.Content[0], join(path, opts.Content[0].Value), "unknown option (%s has no options)", tr.Name)
	}
	opt, err := (&decoder{t: t}).decodeOptions(tr, opts, path)
	if err != nil {
		return nil, err
	}
	e.Options = opt
	return e, nil
}

// DecodeOptions decodes a transform's options from YAML (the mapping under its key in a
// config file; stage and enabled, if present, are ignored) over its defaults. source names the
// text in errors. Empty text gives the defaults.
func DecodeOptions(t *Transform, source string, options []byte) (any, error) {
	root, err := layer{name: source, data: options}.parse()
	if err != nil || root == nil {
		return t.DefaultConfig(), err
	}
	tr := &tree{root: root, src: map[*yaml.Node]string{}}
	tr.mark(root, source)
	opts := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if k := root.Content[i].Value; k != "stage" && k != "enabled" {
			opts.Content = append(opts.Content, root.Content[i], root.Content[i+1])
		}
	}
	if len(opts.Content) == 0 {
		return t.DefaultConfig(), nil
	}
	if t.Config == nil {
		return nil, tr.errorf(opts.Content[0], opts.Content[0].Value, "unknown option (%s has no options)", t.Name)
	}
	return (&decoder{t: tr}).decodeOptions(t, opts, "")
}

func sortedNames(reg map[string]*Transform) []string {
	var out []string
	for name := range reg {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// String prints the resolved configuration as YAML, in run order, as a user file would set
// it; Loom's --print-config style output.
func (c *Config) String() string {
	var sb strings.Builder
	sb.WriteString("transforms:\n")
	for _, e := range c.entries {
		fmt.Fprintf(&sb, "  %s:\n    stage: %s\n    enabled: %t\n", e.Transform.Name, e.Transform.Stage, e.Enabled)
		if e.Options == nil {
			continue
		}
		data, err := yaml.Marshal(e.Options)
		if err != nil {
			fmt.Fprintf(&sb, "    # options: %v\n", err)
			continue
		}
		text := strings.TrimSuffix(string(data), "\n")
		if text == "{}" {
			continue
		}
		for _, line := range strings.Split(text, "\n") {
			sb.WriteString("    " + line + "\n")
		}
	}
	return sb.String()
}
