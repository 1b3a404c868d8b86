package transform

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
)

// NewLineHandler returns a slog handler that writes each record's message alone on a line,
// followed by its attributes as " key=value" if it has any: no time, no level. With it the
// optimizer's summary lines come out exactly as Result.Summary prints them. Records below
// level (nil: info) are dropped.
func NewLineHandler(w io.Writer, level slog.Leveler) slog.Handler {
	if level == nil {
		level = slog.LevelInfo
	}
	return &lineHandler{w: w, mu: &sync.Mutex{}, level: level}
}

type lineHandler struct {
	w      io.Writer
	mu     *sync.Mutex
	level  slog.Leveler
	prefix string // preformatted attributes from WithAttrs
	group  string // dotted group prefix for keys
}

func (h *lineHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level.Level() }

func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
	var sb strings.Builder
	sb.WriteString(r.Message)
	sb.WriteString(h.prefix)
	r.Attrs(func(a slog.Attr) bool {
		writeAttr(&sb, h.group, a)
		return true
	})
	sb.WriteByte('\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, sb.String())
	return err
}

func (h *lineHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	var sb strings.Builder
	for _, a := range attrs {
		writeAttr(&sb, h.group, a)
	}
	c.prefix += sb.String()
	return &c
}

func (h *lineHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.group += name + "."
	return &c
}

func writeAttr(sb *strings.Builder, group string, a slog.Attr) {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return
	}
	if a.Value.Kind() == slog.KindGroup {
		g := group
		if a.Key != "" {
			g += a.Key + "."
		}
		for _, sub := range a.Value.Group() {
			writeAttr(sb, g, sub)
		}
		return
	}
	sb.WriteByte(' ')
	sb.WriteString(group + a.Key)
	sb.WriteByte('=')
	s := a.Value.String()
	if s == "" || strings.ContainsAny(s, " \t\n\"=") {
		s = strconv.Quote(s)
	}
	sb.WriteString(s)
}
