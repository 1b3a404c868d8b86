package graph

import "fmt"

// Rename gives v, a value of g, a new name, which must be valid and not used by another value
// of g. Transforms use it to give a replacement the name of the value it replaced, so that
// dumps before and after stay comparable line by line.
func (g *Graph) Rename(v *Value, name string) error {
	if v == nil {
		return fmt.Errorf("rename: nil value")
	}
	if v.Name == name {
		return nil
	}
	if !validName(name) {
		return fmt.Errorf("rename %s: invalid name %q", v, name)
	}
	if g.names == nil {
		g.names = map[string]bool{}
		for _, in := range g.Inputs {
			g.names[in.Name] = true
		}
		for _, n := range g.Nodes {
			for _, o := range n.Outputs {
				g.names[o.Name] = true
			}
		}
	}
	if g.names[name] {
		return fmt.Errorf("rename %s: name %q is taken", v, name)
	}
	delete(g.names, v.Name)
	g.names[name] = true
	v.Name = name
	return nil
}
