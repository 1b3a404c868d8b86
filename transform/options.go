package transform

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Option structs are decoded strictly: a key must name a field (by its yaml tag, or its
// lower-cased Go name as yaml.v3 does), and a value must have the field's kind exactly; yaml's
// lenient conversions (true into a string, 1.5 into an int, null into anything) are errors
// that name the key and the file.

// optionField is one settable field of an option struct.
type optionField struct {
	name  string
	index int
}

// optionFields lists the exported fields of struct type rt by their YAML names.
func optionFields(rt reflect.Type) []optionField {
	var out []optionField
	for i := 0; i < rt.NumField(); i++ {
		f := rt.Field(i)
		if !f.IsExported() {
			continue
		}
		name := strings.ToLower(f.Name)
		if tag, ok := f.Tag.Lookup("yaml"); ok {
			tagName, _, _ := strings.Cut(tag, ",")
			if tagName == "-" {
				continue
			}
			if tagName != "" {
				name = tagName
			}
		}
		out = append(out, optionField{name: name, index: i})
	}
	return out
}

type decoder struct{ t *tree }

var (
	durationType    = reflect.TypeOf(time.Duration(0))
	unmarshalerType = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()
)

// decodeOptions decodes the option mapping over a copy of the transform's defaults.
func (d *decoder) decodeOptions(tr *Transform, opts *yaml.Node, path string) (any, error) {
	v := reflect.New(reflect.TypeOf(tr.Config)).Elem()
	v.Set(reflect.ValueOf(tr.Config))
	if err := d.decodeStruct(opts, v, path, tr.Name+" has"); err != nil {
		return nil, err
	}
	return v.Interface(), nil
}

// decodeStruct sets the fields of struct v named by mapping n.
func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path, owner string) error {
	if n.Kind != yaml.MappingNode {
		return d.t.errorf(n, path, "want a mapping, got %s", describe(n))
	}
	fields := optionFields(v.Type())
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], resolveAlias(n.Content[i+1])
		kpath := join(path, k.Value)
		idx := -1
		for _, f := range fields {
			if f.name == k.Value {
				idx = f.index
			}
		}
		if idx < 0 {
			names := make([]string, len(fields))
			for j, f := range fields {
				names[j] = f.name
			}
			known := "no options"
			if len(names) > 0 {
				known = "options " + strings.Join(names, ", ")
			}
			return d.t.errorf(k, kpath, "unknown option (%s %s)", owner, known)
		}
		// Decode into a fresh value so that defaults holding maps or slices are never changed.
		fv := reflect.New(v.Field(idx).Type()).Elem()
		if fv.Kind() == reflect.Struct {
			fv.Set(v.Field(idx))
		}
		if err := d.decodeValue(val, fv, kpath); err != nil {
			return err
		}
		v.Field(idx).Set(fv)
	}
	return nil
}

// decodeValue decodes n into v, whose kind decides which YAML values are accepted.
func (d *decoder) decodeValue(n *yaml.Node, v reflect.Value, path string) error {
	n = resolveAlias(n)
	if v.CanAddr() && v.Addr().Type().Implements(unmarshalerType) || v.Kind() == reflect.Interface {
		if err := n.Decode(v.Addr().Interface()); err != nil {
			return d.t.errorf(n, path, "%v", err)
		}
		return nil
	}
	wrong := func(want string) error {
		return d.t.errorf(n, path, "want %s, got %s", want, describe(n))
	}
	if v.Type() == durationType {
		if n.Tag != "!!str" {
			return wrong("a duration such as 1.5s")
		}
		dur, err := time.ParseDuration(n.Value)
		if err != nil {
			return wrong("a duration such as 1.5s")
		}
		v.SetInt(int64(dur))
		return nil
	}
	switch v.Kind() {
	case reflect.Bool:
		if n.Tag != "!!bool" {
			return wrong("true or false")
		}
		var b bool
		if err := n.Decode(&b); err != nil {
			return d.t.errorf(n, path, "%v", err)
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if n.Tag != "!!int" {
			return wrong("an integer")
		}
		i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
		if err != nil || v.OverflowInt(i) {
			return wrong("an integer that fits " + v.Type().String())
		}
		v.SetInt(i)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n.Tag != "!!int" {
			return wrong("a non-negative integer")
		}
		u, err := strconv.ParseUint(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
		if err != nil || v.OverflowUint(u) {
			return wrong("a non-negative integer that fits " + v.Type().String())
		}
		v.SetUint(u)
	case reflect.Float32, reflect.Float64:
		if n.Tag != "!!int" && n.Tag != "!!float" {
			return wrong("a number")
		}
		var f float64
		if err := n.Decode(&f); err != nil {
			return wrong("a number")
		}
		v.SetFloat(f)
	case reflect.String:
		if n.Tag != "!!str" {
			return wrong("a string")
		}
		v.SetString(n.Value)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return wrong("a list")
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, c := range n.Content {
			if err := d.decodeValue(c, s.Index(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		v.Set(s)
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return d.t.errorf(n, path, "option type %s is not supported (map keys must be strings)", v.Type())
		}
		if n.Kind != yaml.MappingNode {
			return wrong("a mapping")
		}
		m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			e := reflect.New(v.Type().Elem()).Elem()
			if err := d.decodeValue(n.Content[i+1], e, join(path, k.Value)); err != nil {
				return err
			}
			m.SetMapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key()), e)
		}
		v.Set(m)
	case reflect.Struct:
		return d.decodeStruct(n, v, path, path+" has")
	case reflect.Pointer:
		if n.Tag == "!!null" {
			v.SetZero()
			return nil
		}
		p := reflect.New(v.Type().Elem())
		if err := d.decodeValue(n, p.Elem(), path); err != nil {
			return err
		}
		v.Set(p)
	default:
		return d.t.errorf(n, path, "option type %s is not supported", v.Type())
	}
	return nil
}

// describe names a YAML value for an error message: its kind and, for a scalar, its text.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	switch n.Tag {
	case "!!null":
		return "null"
	case "!!bool":
		return "the bool " + n.Value
	case "!!int":
		return "the integer " + n.Value
	case "!!float":
		return "the number " + n.Value
	case "!!str":
		return "the string " + strconv.Quote(n.Value)
	}
	return n.Tag + " " + strconv.Quote(n.Value)
}
