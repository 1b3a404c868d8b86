package dist

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// WorldAxis names the group of every rank of a mesh, in rank order. It is never the name of
// a mesh axis, and a collective reaches the world only by naming it.
const WorldAxis = "world"

// maxWorld bounds the number of ranks of a mesh, to keep rank arithmetic far from overflow.
const maxWorld = 1 << 20

// Axis is one named dimension of a Mesh.
type Axis struct {
	Name string // "tp", "dp", "ep", ...: a letter, then letters, digits or _
	Size int    // >= 1
}

// Mesh arranges ranks 0..Size()-1 on named axes.
//
// The first axis listed is the innermost one: it varies fastest as the rank grows, so the
// ranks of one group along it are adjacent. With "tp=2,dp=2", ranks 0 and 1 form the tp
// group of dp replica 0 and ranks 2 and 3 that of replica 1, while the dp groups are {0,2}
// and {1,3}:
//
//	rank = coord[0] + size[0]*(coord[1] + size[1]*(coord[2] + ...))
//
// List tp first, as is conventional: tensor-parallel peers exchange the most data and sit
// best on neighbouring devices.
//
// The zero Mesh has no axes and one rank.
type Mesh struct {
	axes []Axis
}

// ValidAxisName reports whether s can name a mesh axis: a letter, then letters, digits or _,
// and not WorldAxis.
func ValidAxisName(s string) bool {
	if s == "" || s == WorldAxis {
		return false
	}
	for i, r := range s {
		letter := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if !letter && (i == 0 || !(r == '_' || r >= '0' && r <= '9')) {
			return false
		}
	}
	return true
}

// NewMesh builds a mesh from axes, innermost first. Names must be valid (ValidAxisName) and
// distinct, sizes at least 1.
func NewMesh(axes ...Axis) (Mesh, error) {
	if len(axes) == 0 {
		return Mesh{}, fmt.Errorf("dist: a mesh needs at least one axis")
	}
	size := 1
	for i, a := range axes {
		if !ValidAxisName(a.Name) {
			return Mesh{}, fmt.Errorf("dist: mesh axis %d: %q is not a valid axis name (a letter, then letters, digits or _; not %q)", i, a.Name, WorldAxis)
		}
		for _, b := range axes[:i] {
			if b.Name == a.Name {
				return Mesh{}, fmt.Errorf("dist: mesh axis %q appears twice", a.Name)
			}
		}
		if a.Size < 1 {
			return Mesh{}, fmt.Errorf("dist: mesh axis %s has size %d, want >= 1", a.Name, a.Size)
		}
		if a.Size > maxWorld/size {
			return Mesh{}, fmt.Errorf("dist: mesh of more than %d ranks", maxWorld)
		}
		size *= a.Size
	}
	return Mesh{axes: append([]Axis(nil), axes...)}, nil
}

// ParseMesh reads a mesh written as comma-separated name=size pairs, innermost axis first:
// "tp=4", "tp=2,dp=2". Spaces around names and sizes are ignored.
func ParseMesh(s string) (Mesh, error) {
	if strings.TrimSpace(s) == "" {
		return Mesh{}, fmt.Errorf("dist: empty mesh (want e.g. \"tp=2\" or \"tp=2,dp=2\")")
	}
	var axes []Axis
	for _, part := range strings.Split(s, ",") {
		name, size, ok := strings.Cut(part, "=")
		if !ok {
			return Mesh{}, fmt.Errorf("dist: mesh %q: %q is not name=size", s, strings.TrimSpace(part))
		}
		n, err := strconv.Atoi(strings.TrimSpace(size))
		if err != nil {
			return Mesh{}, fmt.Errorf("dist: mesh %q: size of axis %q: %w", s, strings.TrimSpace(name), err)
		}
		axes = append(axes, Axis{Name: strings.TrimSpace(name), Size: n})
	}
	m, err := NewMesh(axes...)
	if err != nil {
		return Mesh{}, fmt.Errorf("parse mesh %q: %w", s, err)
	}
	return m, nil
}

// String writes the mesh as ParseMesh reads it, e.g. "tp=2,dp=2"; the zero Mesh prints "".
func (m Mesh) String() string {
	parts := make([]string, len(m.axes))
	for i, a := range m.axes {
		parts[i] = a.Name + "=" + strconv.Itoa(a.Size)
	}
	return strings.Join(parts, ",")
}

// Axes returns the axes, innermost first.
func (m Mesh) Axes() []Axis { return append([]Axis(nil), m.axes...) }

// Size is the number of ranks: the product of the axis sizes.
func (m Mesh) Size() int {
	n := 1
	for _, a := range m.axes {
		n *= a.Size
	}
	return n
}

// AxisSize returns the size of the named axis; WorldAxis gives Size().
func (m Mesh) AxisSize(name string) (int, error) {
	if name == WorldAxis {
		return m.Size(), nil
	}
	i, err := m.axis(name)
	if err != nil {
		return 0, err
	}
	return m.axes[i].Size, nil
}

func (m Mesh) axis(name string) (int, error) {
	for i, a := range m.axes {
		if a.Name == name {
			return i, nil
		}
	}
	return 0, fmt.Errorf("dist: mesh %q has no axis %q", m.String(), name)
}

func (m Mesh) checkRank(rank int) error {
	if rank < 0 || rank >= m.Size() {
		return fmt.Errorf("dist: rank %d out of range for mesh %q of %d ranks", rank, m.String(), m.Size())
	}
	return nil
}

// Coords returns the coordinates of rank, one per axis in the order of Axes.
func (m Mesh) Coords(rank int) ([]int, error) {
	if err := m.checkRank(rank); err != nil {
		return nil, err
	}
	c := make([]int, len(m.axes))
	for i, a := range m.axes {
		c[i] = rank % a.Size
		rank /= a.Size
	}
	return c, nil
}

// Rank is the inverse of Coords.
func (m Mesh) Rank(coords []int) (int, error) {
	if len(coords) != len(m.axes) {
		return 0, fmt.Errorf("dist: %d coordinates for mesh %q of %d axes", len(coords), m.String(), len(m.axes))
	}
	rank := 0
	for i := len(m.axes) - 1; i >= 0; i-- {
		a := m.axes[i]
		if coords[i] < 0 || coords[i] >= a.Size {
			return 0, fmt.Errorf("dist: coordinate %d out of range for axis %s=%d", coords[i], a.Name, a.Size)
		}
		rank = rank*a.Size + coords[i]
	}
	return rank, nil
}

// Group returns the group of rank along the named axis: the ranks that share every other
// coordinate with it, ordered by their coordinate on the axis, and rank's position among
// them. WorldAxis gives every rank in rank order.
func (m Mesh) Group(rank int, axis string) (Group, error) {
	if err := m.checkRank(rank); err != nil {
		return Group{}, err
	}
	if axis == WorldAxis {
		ranks := make([]int, m.Size())
		for i := range ranks {
			ranks[i] = i
		}
		return Group{Axis: WorldAxis, Ranks: ranks, Index: rank}, nil
	}
	i, err := m.axis(axis)
	if err != nil {
		return Group{}, err
	}
	stride := 1
	for _, a := range m.axes[:i] {
		stride *= a.Size
	}
	size := m.axes[i].Size
	coord := (rank / stride) % size
	base := rank - coord*stride
	ranks := make([]int, size)
	for k := range ranks {
		ranks[k] = base + k*stride
	}
	return Group{Axis: axis, Ranks: ranks, Index: coord}, nil
}

// Group is the ordered ranks of one collective, seen from one of them. The order is the
// order of reduction and of concatenation: Ranks[0]'s data comes first.
type Group struct {
	Axis  string // the mesh axis the group runs along, or WorldAxis
	Ranks []int  // global ranks, in group order
	Index int    // the position of the calling rank in Ranks
}

// NewGroup builds the group of the given ranks for the caller rank, which must be among
// them.
func NewGroup(axis string, ranks []int, rank int) (Group, error) {
	for i, r := range ranks {
		if r == rank {
			g := Group{Axis: axis, Ranks: append([]int(nil), ranks...), Index: i}
			return g, g.Validate(rank, math.MaxInt)
		}
	}
	return Group{}, fmt.Errorf("dist: rank %d is not in group %s%v", rank, axis, ranks)
}

// Size is the number of ranks in the group.
func (g Group) Size() int { return len(g.Ranks) }

// Rank is the global rank of the caller, Ranks[Index].
func (g Group) Rank() int {
	if g.Index < 0 || g.Index >= len(g.Ranks) {
		return -1
	}
	return g.Ranks[g.Index]
}

// String gives the axis and the ranks, e.g. "tp[2 3]".
func (g Group) String() string {
	var sb strings.Builder
	sb.WriteString(g.Axis)
	sb.WriteByte('[')
	for i, r := range g.Ranks {
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(strconv.Itoa(r))
	}
	sb.WriteByte(']')
	return sb.String()
}

// Validate checks that the group is usable by rank in a world of the given size: a named
// axis, distinct ranks within [0, world), and Index pointing at rank.
func (g Group) Validate(rank, world int) error {
	if g.Axis == "" {
		return fmt.Errorf("dist: group %s has no axis name", g)
	}
	if len(g.Ranks) == 0 {
		return fmt.Errorf("dist: group %s has no ranks", g)
	}
	var seen map[int]bool // for large groups; small ones compare pairs, without allocating
	if len(g.Ranks) > 32 {
		seen = make(map[int]bool, len(g.Ranks))
	}
	for i, r := range g.Ranks {
		if r < 0 || r >= world {
			return fmt.Errorf("dist: group %s: rank %d out of range for a world of %d", g, r, world)
		}
		twice := seen[r]
		if seen == nil {
			twice = slices.Contains(g.Ranks[:i], r)
		}
		if twice {
			return fmt.Errorf("dist: group %s lists rank %d twice", g, r)
		}
		if seen != nil {
			seen[r] = true
		}
	}
	if g.Index < 0 || g.Index >= len(g.Ranks) {
		return fmt.Errorf("dist: group %s: index %d out of range", g, g.Index)
	}
	if g.Ranks[g.Index] != rank {
		return fmt.Errorf("dist: group %s: index %d is rank %d, not the caller's rank %d", g, g.Index, g.Ranks[g.Index], rank)
	}
	return nil
}
